"""PostgreSQL 15 as the flywheel runs it (the session's throwaway server, `conftest.postgres`): loopback only,
passwords only. The flywheel on it (Airflow metadata, the MLflow tracking store, registry and auth store,
Feast's SQL registry and online store, the scheduler running tasks in parallel) is the drift loop's
scenario, `test_drift_scenario.py`: one scheduler start, one scheduled training run, for both."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_postgres_listens_on_loopback_with_passwords_only(postgres) -> None:
    import psycopg2

    conf = (postgres.data_dir / "pg_hba.conf").read_text()
    assert "trust" not in "\n".join(line for line in conf.splitlines() if not line.startswith("#"))
    with pytest.raises(psycopg2.OperationalError):
        psycopg2.connect(host="127.0.0.1", port=postgres.port, user="flywheel", password="wrong", dbname="mlflow")
    conn = psycopg2.connect(
        host="127.0.0.1", port=postgres.port, user=postgres.user, password=postgres.password, dbname="postgres"
    )
    with conn.cursor() as cur:
        cur.execute("SHOW listen_addresses")
        assert cur.fetchone()[0] == "127.0.0.1"
        cur.execute("SHOW server_version")
        assert cur.fetchone()[0].startswith("15")
    conn.close()
