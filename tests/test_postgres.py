"""The flywheel on PostgreSQL 15 (a throwaway server on a free loopback port): Airflow metadata, the
MLflow tracking store, registry and auth store, Feast's SQL registry and online store; the real
scheduler running tasks in parallel (LocalExecutor). Never skipped: CI machines have the binaries.
Every log, report and MLflow param is scanned for the database password and credential shapes."""

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


def _a_customer(root: Path) -> str:
    import pyarrow.parquet as pq

    table = pq.read_table(root / "features" / "customer")
    return str(table.column("customer_id")[0])


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
           "FLYWHEEL_FEAST__REGISTRY": postgres.uri("feast"),
           "FLYWHEEL_FEAST__ONLINE_STORE": postgres.uri("feast"),
           "FLYWHEEL_EVALUATION__EXAMPLES": "4", "FLYWHEEL_EVALUATION__SHOTS": "1",
           "FLYWHEEL_EVALUATION__CONSTRAINED": "on",
           "FLYWHEEL_PROMOTION__BASELINE": "none",  # plumbing: the untrained tiny model is promoted unchecked
           "FLYWHEEL_PROMOTION__MAX_EXTRA_WRONG_WRITES": "1000"}  # (its random writes are no verdict either)
    settings = load_settings(root=str(root), airflow={"sql_alchemy_conn": env["FLYWHEEL_AIRFLOW__SQL_ALCHEMY_CONN"]},
                             mlflow={"tracking_uri": postgres.uri("mlflow")},
                             feast={"registry": postgres.uri("feast"), "online_store": postgres.uri("feast")})
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

    # Feast: the SQL registry and the online store live in the `feast` database, and serve lookups
    conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password,
                            dbname="feast")
    with conn.cursor() as cur:
        cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        tables = {row[0] for row in cur.fetchall()}
        cur.execute("SELECT count(*) FROM commerce_flywheel_customer_profile")
        online_rows = cur.fetchone()[0]
    conn.close()
    assert {"feature_views", "entities"} <= tables, tables
    assert online_rows > 0
    assert not (root / "features" / "registry.db").exists() and not (root / "features" / "online_store.db").exists()
    from pipelines.clients.feast import feature_store, online_customer_features

    assert sorted(v.name for v in feature_store(settings).list_feature_views()) == ["category_stats",
                                                                                   "customer_profile"]
    customer = _a_customer(root)
    assert online_customer_features(settings, [customer])[0]["requests_30d"] is not None

    # nothing secret in the run's output, logs, reports, manifests or MLflow params and tags
    from pipelines.clients.mlflow import client
    from pipelines.security import scan_files, scan_mlflow, scan_text

    mlflow_client = client(settings)
    experiments = [e.experiment_id for e in mlflow_client.search_experiments()]
    findings = (scan_text(out, "airflow dags test output", [postgres.password])
                + scan_files([root / "airflow" / "logs", root / "reports", root / "curated" / "manifest.json"],
                             [postgres.password])
                + scan_mlflow(mlflow_client, experiments, [postgres.password]))
    assert findings == [], [str(f) for f in findings]


def _create_databases(postgres, *names: str) -> None:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password,
                            dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        for name in names:
            cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()


def test_scheduler_on_postgres_runs_tasks_in_parallel_with_an_authenticated_mlflow(tmp_path: Path, postgres) -> None:
    """`flywheel up` on Postgres: the MLflow server refuses requests without the generated admin
    password, the Airflow tasks log and register through it with credentials from their environment,
    and LocalExecutor runs a commerce_flywheel run and a drift check at the same time."""
    import base64
    import urllib.error
    import urllib.request
    from datetime import datetime, timedelta, timezone

    import psycopg2

    from helpers import run_flywheel, wait_for
    from pipelines.clients.airflow import AirflowRest
    from pipelines.registry.models import CHAMPION, alias_version

    _create_databases(postgres, "airflow_sched", "mlflow_sched", "mlflow_auth_sched", "feast_sched")
    root = tmp_path / "fw"
    env = {"FLYWHEEL_ROOT": str(root), "FLYWHEEL_AIRFLOW__PORT": str(free_port()),
           "FLYWHEEL_MLFLOW__PORT": str(free_port()),
           "FLYWHEEL_AIRFLOW__SQL_ALCHEMY_CONN": postgres.uri("airflow_sched"),
           "FLYWHEEL_MLFLOW__BACKEND_STORE_URI": postgres.uri("mlflow_sched"),
           "FLYWHEEL_MLFLOW__AUTH_DATABASE_URI": postgres.uri("mlflow_auth_sched"),
           "FLYWHEEL_FEAST__REGISTRY": postgres.uri("feast_sched"),
           "FLYWHEEL_FEAST__ONLINE_STORE": postgres.uri("feast_sched"),
           "FLYWHEEL_TRAIN__SWEEP": TINY_SWEEP, "FLYWHEEL_EVALUATION__EXAMPLES": "4",
           "FLYWHEEL_EVALUATION__SHOTS": "1", "FLYWHEEL_DRIFT__MIN_RECORDS": "100",
           "FLYWHEEL_EVALUATION__CONSTRAINED": "on", "FLYWHEEL_BENCH__CONSTRAINED": "on",
           "FLYWHEEL_PROMOTION__BASELINE": "none",  # plumbing: the untrained tiny model is promoted unchecked
           "FLYWHEEL_PROMOTION__MAX_EXTRA_WRONG_WRITES": "1000",  # (its random writes are no verdict either)
           "FLYWHEEL_DRIFT__EMBEDDING_SAMPLE": "80",
           # the daily run deploys the (untrained, tiny) champion: Triton on free ports, a lenient smoke test
           "FLYWHEEL_TRITON__HTTP_PORT": str(free_port()), "FLYWHEEL_TRITON__GRPC_PORT": str(free_port()),
           "FLYWHEEL_TRITON__METRICS_PORT": str(free_port()), "FLYWHEEL_TRITON__SMOKE_REQUESTS": "2",
           "FLYWHEEL_TRITON__SMOKE_MIN_VALID_JSON": "0", "FLYWHEEL_TRITON__MAX_NEW_TOKENS": "12",
           "FLYWHEEL_BENCH__REQUESTS": "2", "FLYWHEEL_BENCH__CONCURRENCY": "[1]", "FLYWHEEL_BENCH__SHOTS": "1",
           "FLYWHEEL_BENCH__DIRECT": "false"}
    settings = load_settings(root=str(root), airflow={"port": int(env["FLYWHEEL_AIRFLOW__PORT"]),
                                                      "sql_alchemy_conn": postgres.uri("airflow_sched")},
                             mlflow={"port": int(env["FLYWHEEL_MLFLOW__PORT"])})
    today = datetime.now(timezone.utc).date()
    trained_day, new_day = str(today - timedelta(days=1)), str(today)
    try:
        up = run_flywheel("up", "--json", env=env)
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        password = Path(info["mlflow"]["password_file"]).read_text().strip()
        search = f"{info['mlflow']['url']}/api/2.0/mlflow/experiments/search?max_results=5"

        def status(user: str | None, secret: str | None) -> int:
            request = urllib.request.Request(search)
            if user:
                request.add_header("Authorization", "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode())
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return response.status
            except urllib.error.HTTPError as exc:
                return exc.code

        assert status(None, None) == 401 and status("admin", "wrong-password") == 401
        assert status("admin", password) == 200

        rest = AirflowRest(settings)

        def finished(dag_id: str, run_id: str) -> str | None:
            state = rest.dag_run(dag_id, run_id)["state"]
            return state if state in ("success", "failed") else None

        # unpausing starts the daily run (yesterday, synthetic traffic): train, register, promote, deploy
        rest.unpause("commerce_flywheel")
        daily = wait_for(lambda: [r for r in rest.dag_runs("commerce_flywheel") if r.get("run_type") == "scheduled"],
                      120, "the daily run")[0]["dag_run_id"]
        assert wait_for(lambda: finished("commerce_flywheel", daily), 900, "the daily run") == "success"
        rest.unpause("drift_monitor")
        tracked = load_settings(root=str(root), mlflow={"tracking_uri": info["mlflow"]["url"], "username": "admin",
                                                        "password": password})
        assert alias_version(tracked, CHAMPION) == "1"  # registered through the authenticated server

        # a data-path run and a drift check triggered together: LocalExecutor runs their tasks side by side
        second = rest.trigger("commerce_flywheel", {"end_date": new_day, "records_per_day": 1200, "seed": 5,
                                                    "train": False})
        check = rest.trigger("drift_monitor", {"end_date": trained_day})
        assert wait_for(lambda: finished("commerce_flywheel", second), 900, "the data-path run") == "success"
        assert wait_for(lambda: finished("drift_monitor", check), 600, "the drift check") == "success"
        conn = psycopg2.connect(host="127.0.0.1", port=postgres.port, user=postgres.user,
                                password=postgres.password, dbname="airflow_sched")
        with conn.cursor() as cur:
            cur.execute("SELECT run_id, task_id, start_date, end_date FROM task_instance "
                        "WHERE run_id IN (%s, %s) AND start_date IS NOT NULL", (second, check))
            rows = cur.fetchall()
        conn.close()
        data_path = [(s, e) for run, _, s, e in rows if run == second]
        monitor = [(s, e) for run, _, s, e in rows if run == check]
        assert any(s1 < e2 and s2 < e1 for s1, e1 in data_path for s2, e2 in monitor), rows

        from pipelines.clients.mlflow import client
        from pipelines.security import scan_files, scan_mlflow

        mlflow_client = client(tracked)
        experiments = [e.experiment_id for e in mlflow_client.search_experiments()]
        secrets = [postgres.password, password]
        findings = (scan_files([root / "airflow" / "logs", root / "reports", root / "logs"], secrets)
                    + scan_mlflow(mlflow_client, experiments, secrets))
        assert findings == [], [str(f) for f in findings]
    finally:
        run_flywheel("down", env=env)
