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

import asyncio
import contextlib
import json
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request  # resolved at module level: the routes' annotations name them
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines import services
from pipelines.config import ConfigError, Settings
from pipelines.gateway.router import Router, Target  # noqa: F401 (re-exported)

LOG = logging.getLogger("flywheel.gateway")
SERVICE = "gateway"
OWNER = "commerce-flywheel"
SETTINGS_ENV = "FLYWHEEL_GATEWAY_SETTINGS"
MIN_KEY_CHARS = 16
MAX_FEEDBACK_BYTES = 10_000
READY_BUDGET_S = 3.0  # a readiness answer within a Kubernetes probe's timeout (5 s in our manifests)
OPEN_PATHS = ("/health", "/livez", "/ready")  # the probes: no key (they say nothing about requests or data)


# ---- keys and the process ---------------------------------------------------------------------
def api_key_file(settings: Settings) -> Path:
    return Path(str(settings.root)) / "runs" / "gateway.key"


def api_key(settings: Settings) -> str:
    """`gateway.api_key` when set (cluster: from a secret), else one generated once per local root into a
    0600 file (as the MLflow password is)."""
    from pipelines.storage import write_text

    if settings.gateway.api_key is not None:
        key = settings.gateway.api_key.get_secret_value().strip()
    elif not settings.is_local:
        raise ConfigError("gateway.api_key: required by the cluster profile (FLYWHEEL_GATEWAY__API_KEY from a secret)")
    else:
        file = api_key_file(settings)
        if not file.is_file() or not file.read_text().strip():
            write_text(str(file), f"fw-{secrets.token_urlsafe(32)}")  # atomic, 0600 (mkstemp), never half a key
        key = file.read_text().strip()
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
    env = {
        **os.environ,
        SETTINGS_ENV: str(_settings_file(settings)),
        "NO_PROXY": "127.0.0.1,localhost",
        # a registry lookup on the request path fails fast instead of MLflow's 120 s x 7 retries
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }
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
    stopped = services.stop(str(settings.root), SERVICE, grace_s=45)  # uvicorn drains for 20 s, then closes
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
    from pipelines.admission import peers
    from pipelines.admission.fair import FairShare, backend_slots
    from pipelines.admission.quota import replica_name
    from pipelines.config import DEFAULT_PROJECT
    from pipelines.gateway import openai_api as api
    from pipelines.gateway.streaming import stream_response
    from pipelines.gateway.tenants import Tenants
    from pipelines.logs.feedback import RATINGS
    from pipelines.projects import settings_for

    settings = settings_for(settings, DEFAULT_PROJECT)  # the gateway is the platform's; a key names the project
    tenants = Tenants(settings, api_key(settings))
    platform = tenants.tenant(DEFAULT_PROJECT)  # built now: its zones expire at start, /ready asks its router
    tenants.serving()  # and every project that serves traffic: /ready counts it from the start
    probes = ThreadPoolExecutor(max_workers=4, thread_name_prefix="probe")  # /ready's own threads
    fair = FairShare(
        backend_slots(settings),
        settings.gateway.queue_timeout_s,  # turns at the model
        settings.gateway.fair_window_s,
    )

    replica = replica_name(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        # the turns across replicas (gateway/peers.py): which projects send through the others, their demand
        in_step = peers.InStep(fair, settings, replica)
        if fair.slots > 0 and settings.gateway.turns_exchange_s > 0:
            in_step.start()
        yield
        await in_step.stop()  # bounded (~10 s at most; its threads are daemons); a no-op when it never started
        probes.shutdown(wait=False, cancel_futures=True)
        tenants.close()  # per project: captures first, then ratings, comparisons and the day's usage

    app = FastAPI(title="commerce-flywheel gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    def error(exc: api.ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(api.ApiError)
    async def _api_error(_request: Request, exc: api.ApiError) -> JSONResponse:
        return error(exc)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        LOG.error("request failed", exc_info=exc)  # the traceback in the gateway's log, one line to the caller
        return error(
            api.ApiError(
                500,
                f"the gateway failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                kind="server_error",
            )
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(
            api.ApiError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
        )

    @app.middleware("http")
    async def _authenticate(request: Request, call_next: Any) -> Any:
        if request.url.path not in OPEN_PATHS:  # deny by default: only the probes are open
            given = request.headers.get("authorization", "")
            token = given[7:].strip() if given[:7].lower() == "bearer " else ""
            project = await run_in_threadpool(tenants.authenticate, token)
            if project is None:
                return error(
                    api.ApiError(
                        401,
                        "Incorrect API key provided (send `Authorization: Bearer <key>`; "
                        "the key is in the file `flywheel gateway status` names, or a "
                        "project's from `flywheel project key create`)",
                        code="invalid_api_key",
                    )
                )
            request.state.project = project
        return await call_next(request)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        """A caller's rating of an answer: {"id": "<the completion's id>", "rating": "up"|"down"|"none"}.
        Recorded durably in the caller's project; prep applies it to that turn's captured record."""
        raw = await read_body(request, MAX_FEEDBACK_BYTES)
        try:
            data = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise api.ApiError(400, f"We could not parse the JSON body of your request ({exc})") from None
        if not isinstance(data, dict) or not str(data.get("id", "")).startswith("chatcmpl-"):
            raise api.ApiError(400, 'send {"id": "chatcmpl-...", "rating": "up"|"down"}', param="id")
        if data.get("rating") not in RATINGS:
            raise api.ApiError(400, f"rating: expected one of {', '.join(RATINGS)}", param="rating")
        event = {
            "record_id": data["id"],
            "rating": data["rating"],
            "timestamp": datetime.now(UTC).isoformat(timespec="microseconds"),
        }
        tenant = await run_in_threadpool(tenants.tenant, request.state.project)
        await run_in_threadpool(tenant.ratings.write, event)
        return {"id": data["id"], "rating": data["rating"], "recorded": True}

    # probes answer on the event loop or their own small pool, never queued behind completions
    @app.get("/health")
    @app.get("/livez")
    async def health() -> dict[str, str]:
        """Liveness: the process serves HTTP (Kubernetes restarts the pod when this fails)."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: the backend answers and each route's model is loaded (503 otherwise: no traffic). The
        platform's (`default`) routes are shown; with projects, the gateway is ready when any project's routes
        are (each probed at once, within one budget). An open path: it names no project."""
        loop = asyncio.get_running_loop()
        tried = [platform, *(t for t in tenants.all() if t is not platform)]
        probes_ = [asyncio.wait_for(loop.run_in_executor(probes, t.router.readiness), READY_BUDGET_S) for t in tried]
        answers = await asyncio.gather(*probes_, return_exceptions=True)
        found = [
            a if isinstance(a, dict) else {"ready": False, "backend": "no answer in time", "routes": {}}
            for a in answers
        ]
        ok = any(f["ready"] for f in found)
        return JSONResponse({**found[0], "ready": ok}, status_code=200 if ok else 503)

    @app.get("/v1/gateway/queue")
    async def queue(request: Request) -> dict[str, Any]:  # on the event loop, like every use of the turns
        """The turns at the model (gateway/fair.py), totals only: for the gateway's own key (the operator's)."""
        if request.state.project != DEFAULT_PROJECT:
            raise api.ApiError(404, "no such path for a project key", code="not_found")
        return fair.snapshot()

    @app.get("/v1/models")
    def models(request: Request) -> dict[str, Any]:
        """The models of the caller's project only."""
        try:
            targets = tenants.tenant(request.state.project).router.targets()
        except Exception as exc:  # noqa: BLE001 (Triton down: the caller gets a 503, the gateway stays up)
            raise api.ApiError(
                503, f"the model server is not reachable ({type(exc).__name__})", kind="server_error"
            ) from None
        return {
            "object": "list",
            "data": [
                {
                    "id": t.alias,
                    "object": "model",
                    "created": 0,
                    "owned_by": OWNER
                    if request.state.project == DEFAULT_PROJECT
                    else f"{OWNER}/{request.state.project}",
                    "root": t.name,
                    "version": t.version,
                    "prompt_style": t.prompt_style,
                }
                for t in targets.values()
            ],
        }

    inflight = {"n": 0}  # completions being answered: counted on the event loop (no lock needed)
    limit = settings.gateway.max_concurrent_requests

    def leave() -> None:
        inflight["n"] -= 1

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        parsed = api.parse_request(await read_body(request, settings.gateway.max_request_bytes))
        # the project's tenant (built on its first request) and its limits: file reads, off the event loop
        tenant, limits = await run_in_threadpool(tenants.lookup, request.state.project)
        project = request.state.project
        tenant.quota.admit(*limits)  # the project's own quota first: 429 past it (a lock, no I/O, no await)
        try:  # then its share of the gateway's places (gateway/fair.py): a 429 past it
            fair.enter(project, limit)
        except BaseException:
            tenant.quota.release()
            tenant.quota.queued(0, share=True)
            raise
        if inflight["n"] >= limit:  # refused at once, before any work: the caller retries, nothing is half done
            fair.leave(project)
            tenant.quota.release()  # (its request still counts in its requests per minute)
            raise api.too_busy(limit)
        inflight["n"] += 1  # no await between the check and this: two requests never take one slot
        waited: float | None = None

        def done() -> None:
            try:
                leave()
                fair.leave(project)
                tenant.quota.release()
            finally:  # the slot last, so the next turn sees this request gone
                if waited is not None:
                    fair.release(project)

        try:  # its turn at the shared model: fair by project, at most queue_timeout_s
            waited = await fair.acquire(project)
            if waited:
                tenant.quota.queued(waited)
        except BaseException as exc:  # timed out (429), or the caller left while waiting: nothing was sent
            done()
            if isinstance(exc, api.ApiError):
                tenant.quota.queued(fair.timeout_s * 1000, refused=True)
            raise

        if not parsed.stream:
            # the slot is given back when the model's work ends, not when the caller leaves (a cancelled
            # request's thread still runs): the work is its own task, shielded, and calls done() itself
            work = asyncio.ensure_future(run_in_threadpool(tenant.metered.handle, parsed))
            work.add_done_callback(lambda _task: done())
            return JSONResponse(await asyncio.shield(work))
        return await stream_response(tenant.metered, parsed, on_done=done)  # when the generation ends

    return app


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, refused with a 413 as soon as it is over `limit` bytes: by its declared
    Content-Length before reading, else while reading (a chunked body is never read whole). The one
    size check of every body the gateway reads."""
    from pipelines.gateway import openai_api as api

    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise api.too_large(int(declared), limit)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise api.too_large(len(body), limit)
    return bytes(body)


def main() -> None:
    """`python -m pipelines.gateway`: serve with uvicorn on the configured loopback address."""
    import uvicorn

    from pipelines.config import load_settings

    source = os.environ.get(SETTINGS_ENV)
    settings = load_settings(**json.loads(Path(source).read_text())) if source else load_settings()
    if source:  # read once: the file with every secret is gone while the gateway runs, and after any exit
        Path(source).unlink(missing_ok=True)
    uvicorn.run(
        create_app(settings),
        host=settings.gateway.host,
        port=settings.gateway.port,
        log_level="info",
        timeout_graceful_shutdown=20,
    )


if __name__ == "__main__":
    main()
