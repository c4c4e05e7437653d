"""The flywheel on PostgreSQL 15 (a throwaway server on a free loopback port): Airflow metadata
(LocalExecutor) and the MLflow tracking store and registry. Never skipped: CI machines have the binaries."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from pipelines.clients.airflow import dags_test
from pipelines.clients.postgres import start
from pipelines.config import load_settings
from pipelines.services import free_port

pytestmark = pytest.mark.slow
TINY_SWEEP = str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "tiny.yaml")


@pytest.fixture(scope="module")
def postgres():
    folder = Path(tempfile.mkdtemp(prefix="flywheel-pg-"))  # its own folder: as root it goes to the postgres user
    server = start(folder / "data", free_port())
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_postgres_listens_on_loopback_with_passwords_only(postgres) -> None:
    import psycopg2

    conf = (postgres.data_dir / "pg_hba.conf").read_text()
    assert "trust" not in "\n".join(line for line in conf.splitlines() if not line.startswith("#"))
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(host="127.0.0.1", port=postgres.port, user="flywheel", password="wrong", dbname="mlflow")
    conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password,
                            dbname="postgres")
    with conn.cursor() as cur:
        cur.execute("SHOW listen_addresses")
        assert cur.fetchone()[0] == "127.0.0.1"
        cur.execute("SHOW server_version")
        assert cur.fetchone()[0].startswith("15")
    conn.close()


def test_dag_trains_and_registers_with_airflow_and_mlflow_on_postgres(tmp_path: Path, postgres) -> None:
    import psycopg2

    root = tmp_path / "fw"
    env = {"FLYWHEEL_ROOT": str(root),
           "FLYWHEEL_AIRFLOW__SQL_ALCHEMY_CONN": postgres.uri("airflow"),
           "FLYWHEEL_MLFLOW__BACKEND_STORE_URI": postgres.uri("mlflow"),
           "FLYWHEEL_MLFLOW__TRACKING_URI": postgres.uri("mlflow"),
           "FLYWHEEL_EVALUATION__EXAMPLES": "4", "FLYWHEEL_EVALUATION__SHOTS": "1"}
    settings = load_settings(root=str(root), airflow={"sql_alchemy_conn": env["FLYWHEEL_AIRFLOW__SQL_ALCHEMY_CONN"]})
    result = dags_test(settings, "commerce_flywheel", {"end_date": "2026-11-20", "records_per_day": 1200, "seed": 3,
                                                       "train": True, "sweep": TINY_SWEEP, "deploy": False},
                       extra_env=env)  # serving is tested in test_serve / test_dag
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "state=success" in out, out[-3000:]
    assert postgres.password not in out, "the database password never reaches the logs"
    conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password,
                            dbname="airflow")
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM task_instance WHERE dag_id = 'commerce_flywheel' AND state = 'success'")
        assert cur.fetchone()[0] >= 9  # window .. promote, all on the Postgres metadata DB
    conn.close()
    conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password,
                            dbname="mlflow")
    with conn.cursor() as cur:
        cur.execute("SELECT alias, version FROM registered_model_aliases")
        aliases = dict(cur.fetchall())
        cur.execute("SELECT count(*) FROM runs")
        runs = cur.fetchone()[0]
    conn.close()
    assert aliases.get("champion") == 1 and aliases.get("candidate") == 1
    assert runs >= 3  # sweep parent + two variants
    assert json.loads((root / "curated" / "manifest.json").read_text())["training_set"]["digest"]
