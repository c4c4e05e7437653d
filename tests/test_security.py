"""Secrets stay out of what the platform prints and writes: masked URIs, `config show`, and the
scanner behind `flywheel scan-secrets` (also run over the Postgres-backed flywheel in test_drift_scenario)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_flywheel

from pipelines.config import load_settings
from pipelines.security import configured_secrets, redact_uri, scan_text


def test_uris_are_shown_with_their_password_masked() -> None:
    assert (
        redact_uri("postgresql+psycopg2://flywheel:p%40ss@db.internal:5432/mlflow")
        == "postgresql+psycopg2://flywheel:***@db.internal:5432/mlflow"
    )
    assert redact_uri("s3://bucket/flywheel") == "s3://bucket/flywheel"
    assert redact_uri("/plain/path") == "/plain/path" and redact_uri(None) is None


def test_the_scanner_finds_values_and_credential_shapes_without_repeating_them() -> None:
    text = "\n".join(
        [
            "all good",
            "conn=postgresql://u:hunter2-long@h/db",
            "key AKIAABCDEFGHIJKLMNOP",
            "masked postgresql://u:***@h/db",
            "token Bearer abcdefghijklmnopqrstuvwxyz012345",
            "the admin password is correct-horse-battery",
        ]
    )
    findings = scan_text(text, "app.log", ["correct-horse-battery"])
    assert {(f.line, f.kind) for f in findings} == {
        (2, "uri_with_password"),
        (3, "aws_access_key_id"),
        (5, "bearer_token"),
        (6, "secret value"),
    }
    assert all("hunter2" not in str(f) and "correct-horse" not in str(f) for f in findings)


def test_configured_secrets_include_passwords_inside_uris(tmp_path: Path) -> None:
    settings = load_settings(
        root=str(tmp_path),
        mlflow={"password": "mlflow-pass-1"},
        feast={"online_store": "postgresql://f:feast-pass-2@127.0.0.1:5432/feast"},
        evaluation={"judge_api_key": "judge-key-3"},
    )
    assert {"mlflow-pass-1", "feast-pass-2", "judge-key-3"} <= set(configured_secrets(settings))


def test_config_show_and_scan_secrets_cli(tmp_path: Path) -> None:
    env = {
        "FLYWHEEL_ROOT": str(tmp_path / "fw"),
        "FLYWHEEL_MLFLOW__PASSWORD": "planted-secret-value",
        "FLYWHEEL_AIRFLOW__SQL_ALCHEMY_CONN": "postgresql://a:db-secret-value@127.0.0.1:5432/airflow",
    }
    shown = run_flywheel("config", "show", "--json", env=env)
    assert shown.returncode == 0 and "db-secret-value" not in shown.stdout and "planted-secret" not in shown.stdout
    assert json.loads(shown.stdout)["airflow"]["sql_alchemy_conn"] == "postgresql://a:***@127.0.0.1:5432/airflow"

    clean = run_flywheel("scan-secrets", "--json", env=env)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["findings"] == 0
    log = tmp_path / "fw" / "logs" / "worker.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("starting\nconnecting with password planted-secret-value\ndone\n")
    found = run_flywheel("scan-secrets", "--json", env=env)
    assert found.returncode == 1
    report = json.loads(found.stdout)
    assert report["findings"] == 1 and report["where"] == [f"{log}:2: secret value"]
    assert "planted-secret-value" not in found.stdout + found.stderr


def test_scan_secrets_knows_the_generated_gateway_key(tmp_path: Path) -> None:
    from pipelines.config import load_settings
    from pipelines.gateway.app import api_key, api_key_file

    settings = load_settings(root=str(tmp_path / "fw"))
    key = api_key(settings)
    assert oct(api_key_file(settings).stat().st_mode & 0o777) == "0o600" and api_key(settings) == key  # once per root
    log = tmp_path / "fw" / "logs" / "gateway.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"INFO request with Authorization: Bearer {key}\n")
    found = run_flywheel("scan-secrets", "--json", env={"FLYWHEEL_ROOT": str(tmp_path / "fw")})
    assert found.returncode == 1 and json.loads(found.stdout)["where"][0].startswith(f"{log}:1")
    assert key not in found.stdout + found.stderr


def test_scan_secrets_knows_airflows_and_the_members_generated_passwords(tmp_path: Path) -> None:
    """Airflow's login passwords (its password file), a project member's password file, and the multi-team
    token-signing secret are each found where a log repeats them. (Mutation tried: Airflow's secrets left out of
    the scan, its login password is not found.)"""
    from pipelines.clients.airflow import password_file
    from pipelines.config import load_settings
    from pipelines.stack.airflow import multi_team_env_file

    settings = load_settings(root=str(tmp_path / "fw"))
    planted = {
        "airflow": "af-Login-Pw-8d1e2f3a4b5c6d7e",
        "member": "mlflow-Member-Pw-1a2b3c4d5e6f",
        "jwt": "jwt-Signing-Secret-9f8e7d6c5b4a",
    }
    password_file(settings).parent.mkdir(parents=True, exist_ok=True)
    password_file(settings).write_text(json.dumps({"carol@shop": planted["airflow"]}))
    multi_team_env_file(settings).write_text(json.dumps({"AIRFLOW__API_AUTH__JWT_SECRET": planted["jwt"]}))
    users = tmp_path / "fw" / "runs" / "users"
    users.mkdir(parents=True)
    (users / "carol.password").write_text(planted["member"] + "\n")
    log = tmp_path / "fw" / "logs" / "airflow.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    for what, value in planted.items():
        log.write_text(f"INFO {what}: {value}\n")
        found = run_flywheel("scan-secrets", "--json", env={"FLYWHEEL_ROOT": str(tmp_path / "fw")})
        assert found.returncode == 1 and json.loads(found.stdout)["where"][0].startswith(f"{log}:1"), what
        assert value not in found.stdout + found.stderr


def test_scan_secrets_reads_every_projects_reports_and_every_page_of_mlflow(tmp_path: Path) -> None:
    """A project's report repeating a key is found (it lives under <root>/projects/<name>/reports, not the root's
    reports); MLflow's runs and versions are read page by page to the end, not the first 5,000 / 1,000.
    (Mutations tried: the root's reports alone miss the project's; one page only misses the run on page 2.)"""
    from pipelines.config import load_settings
    from pipelines.gateway.app import api_key
    from pipelines.security import scan_mlflow

    root = tmp_path / "fw"
    key = api_key(load_settings(root=str(root)))
    report = root / "projects" / "search" / "reports" / "evaluation" / "x" / "report.html"
    report.parent.mkdir(parents=True)
    report.write_text(f"<p>called with Bearer {key}</p>")
    found = run_flywheel("scan-secrets", "--json", env={"FLYWHEEL_ROOT": str(root)})
    assert found.returncode == 1 and json.loads(found.stdout)["where"][0].startswith(str(report)), found.stdout

    class Page(list):
        """A stand-in for MLflow's `PagedList` (a page of results and the next page's token)."""

        def __init__(self, items: list, token: str | None) -> None:
            super().__init__(items)
            self.token = token

    class Run:
        """A stand-in for MLflow's `Run`: `info` and `data` are made with `type(...)` to stand in for `RunInfo`
        and `RunData`, with only the fields the scanner reads."""

        def __init__(self, run_id: str, params: dict) -> None:
            self.info = type("Info", (), {"run_id": run_id})()
            self.data = type("Data", (), {"params": params, "tags": {}})()

    class TwoPages:
        """A stand-in for `MlflowClient`'s paged searches: two pages, the secret on the second. The real client
        against a real MLflow server is scanned in
        tests/test_drift_scenario.py::test_drift_alert_retrains_once_under_the_scheduler_on_postgres."""

        def search_runs(self, experiment_ids, max_results, page_token=None):
            if page_token is None:
                return Page([Run("r1", {"lr": "0.1"})], "next")
            return Page([Run("r2", {"uri": "postgresql://u:Secret-Pw-12345@h/db"})], None)

        def search_model_versions(self, max_results, page_token=None):
            return Page([], None)

    findings = scan_mlflow(TwoPages(), ["1"], ["Secret-Pw-12345"])
    assert [str(f).split(" ", 2)[:2] for f in findings][:1] == [["run", "r2"]]


def test_a_secret_file_is_created_once_whole_and_private(tmp_path: Path) -> None:
    """`storage.create_secret_once` (the MLflow admin password, the gateway key, PostgreSQL's): 0600 from its first
    byte; a second start keeps the first one's secret; an empty file an older crash left is replaced. (Mutation: the
    empty file kept: the secret read back is empty.)"""
    import stat

    from pipelines.storage import create_secret_once

    path = tmp_path / "runs" / "secret.password"
    assert create_secret_once(str(path), "first") == "first"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert create_secret_once(str(path), "second") == "first"  # the first one's wins
    path.write_text("")  # what a crash between create and write used to leave
    assert create_secret_once(str(path), "third") == "third"
    assert sorted(p.name for p in path.parent.iterdir()) == ["secret.password"]  # no temporary file left
