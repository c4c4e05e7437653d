"""Thin client for MLflow: the tracking server (basic authentication on by default) and the tracking
URI every stage uses.

Store URIs reach the server through its environment (MLFLOW_BACKEND_STORE_URI), not its command
line, so a database password never shows in `ps` or in our logs.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from pipelines.config import REPO_ROOT, ConfigError, Settings
from pipelines.services import ServiceSpec

AUTH_TEMPLATE = REPO_ROOT / "mlflow" / "basic_auth.ini"
ADMIN = "admin"


def server_url(settings: Settings) -> str:
    return f"http://{settings.mlflow.host}:{settings.mlflow.port}"


def server_spec(settings: Settings) -> ServiceSpec:
    m = settings.mlflow
    if str(m.backend_store_uri).startswith("sqlite:///"):
        Path(str(m.backend_store_uri).removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    if settings.is_local:
        Path(str(m.artifacts_destination)).mkdir(parents=True, exist_ok=True)
    url = server_url(settings)
    env = dict(os.environ)
    env.update({"NO_PROXY": "127.0.0.1,localhost", "MLFLOW_BACKEND_STORE_URI": str(m.backend_store_uri)})
    # MLflow 3's job runner (GenAI jobs: prompt optimisation, scorers, issue detection; and its periodic online
    # scoring, trace archival and SQL trace rollups) starts six huey consumer processes beside the server, each
    # importing MLflow: ~40 CPU-seconds and ~1 GB at every start on two cores, polling after, for jobs the platform
    # never submits (it uses no GenAI evaluation or tracing). Off unless the operator's environment turns it on.
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    auth: list[str] = []
    if m.auth:
        env.update(
            {
                "MLFLOW_AUTH_CONFIG_PATH": str(auth_config(settings)),
                "MLFLOW_AUTH_ADMIN_USERNAME": ADMIN,
                "MLFLOW_AUTH_ADMIN_PASSWORD": admin_password(settings),
                # signs the UI's CSRF tokens; the same for every server replica
                "MLFLOW_FLASK_SERVER_SECRET_KEY": _secret(settings, "server_secret_key", "mlflow-server.key"),
            }
        )
        auth = ["--app-name", "basic-auth"]
    return ServiceSpec(
        name="mlflow",
        command=[
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            *auth,
            "--artifacts-destination",
            str(m.artifacts_destination),
            "--serve-artifacts",
            "--host",
            m.host,
            "--port",
            str(m.port),
            "--workers",
            str(m.workers),
        ],
        env=env,
        health_url=f"{url}/health",
        url=url,
    )


def _secret(settings: Settings, field: str, file_name: str) -> str:
    """`mlflow.<field>` when set (cluster: from a Kubernetes/Secrets Manager secret), else one
    generated once per local root into a 0600 file."""
    value = getattr(settings.mlflow, field)
    if value is not None:
        return value.get_secret_value()
    if not settings.is_local:
        raise ConfigError(
            f"mlflow.{field}: required by the cluster profile when mlflow.auth is on "
            f"(FLYWHEEL_MLFLOW__{field.upper()} from a secret)"
        )
    from pipelines.storage import create_secret_once

    return create_secret_once(str(Path(str(settings.root)) / "runs" / file_name), secrets.token_urlsafe(32))


def admin_password(settings: Settings) -> str:
    return _secret(settings, "password", "mlflow-admin.password")


def auth_config(settings: Settings) -> Path:
    """mlflow/basic_auth.ini with its user-store URI filled in, written next to the tracking store (0600)."""
    m = settings.mlflow
    runs = Path(str(settings.root)) / "runs" if settings.is_local else Path.home() / ".flywheel"
    database = m.auth_database_uri or f"sqlite:///{runs / 'basic_auth.db'}"
    out = runs / "basic_auth.ini"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.touch(mode=0o600)
    out.write_text(AUTH_TEMPLATE.read_text().replace("${database_uri}", database))
    return out


def server_credentials(settings: Settings) -> dict[str, str]:
    """The environment a client of the local authenticated server needs (for Airflow's tasks)."""
    if not settings.mlflow.auth:
        return {}
    return {"FLYWHEEL_MLFLOW__USERNAME": ADMIN, "FLYWHEEL_MLFLOW__PASSWORD": admin_password(settings)}


def use_tracking(settings: Settings) -> str:
    """Point the mlflow library at the configured tracking store; the experiment's id (created on first use).

    Locally the tracking URI is the SQLite store itself (no server needed); artifacts go to the same
    folder the local server serves, so `flywheel up` shows every run and adapter."""
    import logging

    import mlflow

    for noisy in ("mlflow", "alembic"):  # store creation and migrations log at INFO on first use
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # against a tracking server MLflow prints "View run ... at: <url>" on stdout when a run ends, which would
    # break every `--json` output of ours (the run's link is in the MLflow UI and our reports anyway)
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    m = settings.mlflow
    if m.username and m.password:
        os.environ["MLFLOW_TRACKING_USERNAME"] = m.username
        os.environ["MLFLOW_TRACKING_PASSWORD"] = m.password.get_secret_value()
    mlflow.set_tracking_uri(str(m.tracking_uri))
    experiment = mlflow.get_experiment_by_name(m.experiment)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return mlflow.create_experiment(m.experiment, artifact_location=artifact_location(settings, m.experiment))
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent task
        experiment = mlflow.get_experiment_by_name(m.experiment)
        if experiment is None:  # nobody created it: the creation failed for another reason
            raise
        return experiment.experiment_id


def artifact_location(settings: Settings, experiment: str) -> str | None:
    """Where a new experiment keeps its artifacts: on the local profile's SQLite store, the folder the local
    server serves (the store's own default, `./mlruns`, is relative to whatever directory the process started
    in: a user's shell, an Airflow task); elsewhere the server's default."""
    m = settings.mlflow
    if settings.is_local and str(m.tracking_uri).startswith("sqlite:"):
        return Path(str(m.artifacts_destination)).joinpath(experiment).as_uri()
    return None


def client(settings: Settings):
    """An MlflowClient on the configured tracking store (and registry)."""
    from mlflow import MlflowClient

    use_tracking(settings)
    return MlflowClient()
