"""Shared fixtures: every test gets its own flywheel root and a clean settings cache; one Spark session and
one throwaway PostgreSQL 15 server (on a free loopback port, passwords only) serve the whole run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# `make test` runs two pytest-xdist workers, a module per worker (`-n 2 --dist loadfile
# --no-loadscope-reorder`). Each worker's torch (and every process it starts: `airflow dags test`, NeMo's
# trainer, Triton's stubs) gets one thread: two threads on a core the other worker also uses stall torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

# The longest modules go first so that neither worker is left with one at the end (`--durations` in the CI
# log gives the figures); the rest keep file order.
FIRST = ("test_dag.py", "test_train_nemo.py", "test_gateway.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: n for n, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: file order otherwise


@pytest.fixture
def flywheel_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in list(os.environ):
        if key.startswith("FLYWHEEL_"):
            monkeypatch.delenv(key)
    root = tmp_path / "flywheel"
    monkeypatch.setenv("FLYWHEEL_ROOT", str(root))
    yield root


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    """One local Spark session for the whole test run (starting one costs ~10 s)."""
    from pipelines.clients.spark import get_spark
    from pipelines.config import load_settings

    session = get_spark(load_settings(root=str(tmp_path_factory.mktemp("spark-root"))))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres():
    """PostgreSQL 15 in its own folder (as root it goes to the postgres user); `create_databases` adds
    databases to it (`helpers.create_databases`). Started once for every test that asks (starting one costs seconds,
    not minutes)."""
    import shutil
    import tempfile

    from ports import free_port

    from pipelines.clients.postgres import start

    folder = Path(tempfile.mkdtemp(prefix="flywheel-pg-"))
    server = start(folder / "data", free_port())
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)
