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
