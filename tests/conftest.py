"""Shared fixtures: every test gets its own flywheel root and a clean settings cache; one Spark session and
one throwaway PostgreSQL 15 server (on a free loopback port, passwords only) serve the whole run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipelines.config import get_settings

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture
def flywheel_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in list(os.environ):
        if key.startswith("FLYWHEEL_"):
            monkeypatch.delenv(key)
    root = tmp_path / "flywheel"
    monkeypatch.setenv("FLYWHEEL_ROOT", str(root))
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


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
    databases to it (`helpers.create_databases`). Started once for every test that asks (starting one costs seconds, not minutes)."""
    import shutil
    import tempfile

    from pipelines.clients.postgres import start
    from pipelines.services import free_port

    folder = Path(tempfile.mkdtemp(prefix="flywheel-pg-"))
    server = start(folder / "data", free_port())
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)

