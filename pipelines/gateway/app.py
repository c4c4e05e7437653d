"""The OpenAI-compatible front door: an agent switches to the tuned model by changing its `base_url`.

`POST /v1/chat/completions` (sync, or `stream: true` as server-sent events) and `GET /v1/models`,
behind a bearer API key, on 127.0.0.1. A request is turned into the row the training set would hold
(`openai_api.request_row`, prep's own functions), rendered by the serving client's `conversation`
(Feast's online context for `user`, the customer id, as training did), sent to the Triton model
behind the asked alias, decoded under the offered tools' grammar (`triton.constrained`), answered in
the OpenAI shape, and captured as one log record in the raw zone before the answer leaves
(`capture.CaptureWriter`). Aliases: `champion` (the live deployment), `previous`, `candidate` (the
registry alias, when its model is loaded), `v<N>` (any loaded registered version) and `base` (the
base model with retrieved examples: the serving alternative).

Run it with `flywheel gateway up` (a process of its own, like the other local servers).
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines import services
from pipelines.config import ConfigError, Settings
from pipelines.gateway.router import Router, Target  # noqa: F401 (re-exported)

SERVICE = "gateway"
SETTINGS_ENV = "FLYWHEEL_GATEWAY_SETTINGS"
MIN_KEY_CHARS = 16
READY_BUDGET_S = 3.0  # a readiness answer within a Kubernetes probe's timeout (5 s in our manifests)


# ---- keys and the process ---------------------------------------------------------------------
def api_key_file(settings: Settings) -> Path:
    return Path(str(settings.root)) / "runs" / "gateway.key"


def api_key(settings: Settings) -> str:
    """`gateway.api_key` when set (cluster: from a secret), else one generated once per local root into a
    0600 file (as the MLflow password is)."""
    from pipelines.storage import create_secret_once

    if settings.gateway.api_key is not None:
        key = settings.gateway.api_key.get_secret_value().strip()
    elif not settings.is_local:
        raise ConfigError("gateway.api_key: required by the cluster profile (FLYWHEEL_GATEWAY__API_KEY from a secret)")
    else:
        key = create_secret_once(str(api_key_file(settings)), f"fw-{secrets.token_urlsafe(32)}")  # never half a key
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(
            f"gateway.api_key: at least {MIN_KEY_CHARS} characters (an empty or short key would let "
            f"anyone call the gateway)"
        )
    return key


def base_url(settings: Settings) -> str:
    return f"http://{settings.gateway.host}:{settings.gateway.port}/v1"


def _settings_file(settings: Settings) -> Path:
    """The settings the gateway process runs with, secrets included, in a 0600 file under run/."""
    from pydantic import SecretStr

    from pipelines.config import DEFAULT_PROJECT
    from pipelines.projects import settings_for
    from pipelines.storage import write_text

    path = services.run_dir(str(settings.root)) / "gateway-settings.json"
    platform = settings_for(settings, DEFAULT_PROJECT)  # the gateway serves every project: never one's names
    data = json.dumps(
        platform.model_dump(mode="python"),
        default=lambda v: v.get_secret_value() if isinstance(v, SecretStr) else str(v),
    )
    write_text(str(path), data)  # atomic and 0600 (mkstemp); removed again by `down`
    return path


def server_spec(settings: Settings) -> services.ServiceSpec:
    api_key(settings)  # generated before the process starts, so `status` can name it at once
    env = {**os.environ, SETTINGS_ENV: str(_settings_file(settings)), "NO_PROXY": "127.0.0.1,localhost"}
    url = f"http://{settings.gateway.host}:{settings.gateway.port}"
    return services.ServiceSpec(
        SERVICE, [sys.executable, "-m", "pipelines.gateway"], env, f"{url}/health", base_url(settings)
    )


def up(settings: Settings, timeout_s: float = 120) -> services.ServiceStatus:
    return services.start(
        str(settings.root),
        server_spec(settings),
        host=settings.gateway.host,
        port=settings.gateway.port,
        timeout_s=timeout_s,
    )


def down(settings: Settings) -> bool:
    # the gateway's own stop is bounded by gateway.shutdown_grace_s (drain, captures, usage): a little more here
    stopped = services.stop(str(settings.root), SERVICE, grace_s=settings.gateway.shutdown_grace_s + 10)
    (services.run_dir(str(settings.root)) / "gateway-settings.json").unlink(missing_ok=True)
    return stopped


def status(settings: Settings) -> dict[str, Any]:
    """Running and healthy (alive), and `ready`: whether it can answer (its /ready), with each route's state."""
    url = f"http://{settings.gateway.host}:{settings.gateway.port}"
    row = services.status(str(settings.root), SERVICE, f"{url}/health", base_url(settings)).to_dict()
    readiness: dict[str, Any] = {"ready": False, "routes": {}}
    if row.get("healthy"):
        import httpx

        try:
            readiness = httpx.get(f"{url}/ready", timeout=READY_BUDGET_S + 2).json()
        except (httpx.HTTPError, ValueError) as exc:
            readiness = {"ready": False, "backend": f"/ready did not answer ({type(exc).__name__})", "routes": {}}
    return {
        **row,
        "ready": bool(readiness.get("ready")),
        "backend": readiness.get("backend"),
        "routes": readiness.get("routes", {}),
        "url": base_url(settings),
        "api_key_file": str(api_key_file(settings))
        if settings.gateway.api_key is None
        else "gateway.api_key (configured)",
    }


# ---- the app -----------------------------------------------------------------------------------
def create_app(settings: Settings) -> Any:
    """The FastAPI app: `endpoints.Gateway`'s handlers on their routes, behind the key check."""
    from pipelines.config import DEFAULT_PROJECT
    from pipelines.gateway import endpoints, schema
    from pipelines.gateway import openai_api as api
    from pipelines.projects import settings_for

    settings = settings_for(settings, DEFAULT_PROJECT)  # the gateway is the platform's; a key names the project
    gateway = endpoints.Gateway(settings, api_key(settings), READY_BUDGET_S)
    app = FastAPI(
        title="commerce-flywheel gateway",
        version="1",
        description="OpenAI-compatible chat completions for a commerce agent's tool calls",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,  # not served: the schema is the docs' HTTP reference and the fuzz tests' input
        lifespan=gateway.lifespan,
    )
    app.exception_handler(api.ApiError)(endpoints.api_error)
    app.exception_handler(Exception)(endpoints.unexpected)
    app.exception_handler(StarletteHTTPException)(endpoints.http_error)
    app.middleware("http")(gateway.authenticate)
    for path, method, handler, summary in (
        ("/v1/feedback", "POST", gateway.feedback, "Rate an answer"),
        ("/livez", "GET", endpoints.health, "Liveness probe"),
        ("/health", "GET", endpoints.health, "Liveness probe (alias of /livez)"),
        ("/ready", "GET", gateway.ready, "Readiness probe"),
        ("/v1/gateway/queue", "GET", gateway.queue, "The turns at the model (operator key only)"),
        ("/v1/models", "GET", gateway.models, "List the caller's models"),
        ("/v1/chat/completions", "POST", gateway.chat_completions, "Create a chat completion (a tool call)"),
    ):
        app.add_api_route(path, handler, methods=[method], summary=summary, description=handler.__doc__)
    app.openapi = lambda: schema.openapi(app)  # type: ignore[method-assign]  # FastAPI's documented override
    return app
