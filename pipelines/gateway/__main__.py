"""`python -m pipelines.gateway`: the gateway's entry point. Its settings come from the 0600 file `flywheel gateway
up` wrote (named by FLYWHEEL_GATEWAY_SETTINGS, read once and removed: the secrets in it are gone while the gateway
runs), else from the configuration (a pod: FLYWHEEL_* from its ConfigMap and Secret); served with uvicorn on the
configured address."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pipelines.gateway.app import SETTINGS_ENV, create_app
from pipelines.gateway.endpoints import drain_s

MLFLOW_TIMEOUT_S = 5


def main() -> None:
    """`python -m pipelines.gateway`: serve with uvicorn on the configured loopback address."""
    import uvicorn

    from pipelines.config import load_settings

    # the router asks MLflow while it builds a routing table inside a caller's request: fail fast there instead of
    # MLflow's default of 120 s x 7 retries (the same in a pod as locally; a caller's own values win)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(MLFLOW_TIMEOUT_S))
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    source = os.environ.get(SETTINGS_ENV)
    settings = load_settings(**json.loads(Path(source).read_text())) if source else load_settings()
    if source:  # read once: the file with every secret is gone while the gateway runs, and after any exit
        Path(source).unlink(missing_ok=True)
    uvicorn.run(
        create_app(settings),
        host=settings.gateway.host,
        port=settings.gateway.port,
        log_level="info",
        timeout_graceful_shutdown=int(drain_s(settings)),
    )


if __name__ == "__main__":
    main()
