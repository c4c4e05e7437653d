"""Thin client for MLflow: the local tracking server and the tracking URI every stage uses."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipelines.config import Settings
from pipelines.services import ServiceSpec


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
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return ServiceSpec(
        name="mlflow",
        command=[
            str(Path(sys.executable).parent / "mlflow"), "server",
            "--backend-store-uri", str(m.backend_store_uri),
            "--artifacts-destination", str(m.artifacts_destination),
            "--serve-artifacts",
            "--host", m.host, "--port", str(m.port), "--workers", str(m.workers),
        ],
        env=env,
        health_url=f"{url}/health",
        url=url,
    )


def use_tracking(settings: Settings) -> str:
    """Point the mlflow library at the configured tracking store; the experiment's id (created on first use).

    Locally the tracking URI is the SQLite store itself (no server needed); artifacts go to the same
    folder the local server serves, so `flywheel up` shows every run and adapter."""
    import logging

    import mlflow

    for noisy in ("mlflow", "alembic"):  # store creation and migrations log at INFO on first use
        logging.getLogger(noisy).setLevel(logging.WARNING)
    m = settings.mlflow
    if m.username and m.password:
        os.environ["MLFLOW_TRACKING_USERNAME"] = m.username
        os.environ["MLFLOW_TRACKING_PASSWORD"] = m.password.get_secret_value()
    mlflow.set_tracking_uri(str(m.tracking_uri))
    experiment = mlflow.get_experiment_by_name(m.experiment)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if settings.is_local and str(m.tracking_uri).startswith("sqlite:"):
        location = Path(str(m.artifacts_destination)).joinpath(m.experiment).as_uri()
    try:
        return mlflow.create_experiment(m.experiment, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created meanwhile by a concurrent task
        return mlflow.get_experiment_by_name(m.experiment).experiment_id


def client(settings: Settings):
    """An MlflowClient on the configured tracking store (and registry)."""
    from mlflow import MlflowClient

    use_tracking(settings)
    return MlflowClient()
