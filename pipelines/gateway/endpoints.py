"""The gateway app's state and its handlers, one method each (`app.create_app` wires them to the routes).

`Gateway` holds what the app keeps while it runs: every project's tenant, the fair turns at the model, the
completions in flight and /ready's probe threads. A completion is admitted in order: the project's quota,
its share of the gateway's places, the in-flight limit, then its turn at the shared model (`_admit`);
`_Places` gives all of them back once its work ends. Errors leave in OpenAI's shape (`error_response`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from fastapi import Request  # resolved at module level: the routes' annotations name it
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipelines.admission import peers
from pipelines.admission.fair import FairShare, backend_slots
from pipelines.admission.quota import replica_name
from pipelines.config import DEFAULT_PROJECT, Settings
from pipelines.gateway import openai_api as api
from pipelines.gateway.capture import WriterClosed
from pipelines.gateway.streaming import stream_response
from pipelines.gateway.tenants import Tenants, closed_error
from pipelines.logs.feedback import RATINGS

LOG = logging.getLogger("flywheel.gateway")
OWNER = "commerce-flywheel"
MAX_FEEDBACK_BYTES = 10_000
OPEN_PATHS = ("/health", "/livez", "/ready")  # the probes: no key (they say nothing about requests or data)


def error_response(exc: api.ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def api_error(_request: Request, exc: api.ApiError) -> JSONResponse:
    return error_response(exc)


async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
    LOG.error("request failed", exc_info=exc)  # the traceback in the gateway's log, one line to the caller
    return error_response(
        api.ApiError(
            500,
            f"the gateway failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            kind="server_error",
        )
    )


async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    return error_response(
        api.ApiError(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)
    )


def drain_s(settings: Settings) -> float:
    """How long a stop lets requests in flight finish (uvicorn's graceful shutdown): a share of the stop's budget
    (`gateway.shutdown_grace_s`), the rest is the captures' last upload and the usage."""
    return min(20.0, settings.gateway.shutdown_grace_s * 0.4)


def _overdue() -> None:
    LOG.error("the gateway's stop ran past gateway.shutdown_grace_s: exiting now (spooled files upload next start)")
    logging.shutdown()
    os._exit(3)


# probes answer on the event loop or their own small pool, never queued behind completions
async def health() -> dict[str, str]:
    """Liveness: the process serves HTTP (Kubernetes restarts the pod when this fails)."""
    return {"status": "ok"}


class Gateway:
    """The app's state while it runs, with its lifespan, its key check and one method per endpoint."""

    def __init__(self, settings: Settings, key: str, ready_budget_s: float) -> None:
        self.settings = settings
        self.ready_budget_s = ready_budget_s
        self.tenants = Tenants(settings, key)
        self.platform = self.tenants.tenant(
            DEFAULT_PROJECT
        )  # built now: its zones expire at start, /ready asks its router
        self.tenants.serving()  # and every project that serves traffic: /ready counts it from the start
        self.probes = ThreadPoolExecutor(max_workers=4, thread_name_prefix="probe")  # /ready's own threads
        self.fair = FairShare(
            backend_slots(settings),
            settings.gateway.queue_timeout_s,  # turns at the model
            settings.gateway.fair_window_s,
        )
        self.replica = replica_name(settings)
        self.inflight = 0  # completions being answered: counted on the event loop (no lock needed)
        self.limit = settings.gateway.max_concurrent_requests

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        # the turns across replicas (gateway/peers.py): which projects send through the others, their demand
        in_step = peers.InStep(self.fair, self.settings, self.replica)
        if self.fair.slots > 0 and self.settings.gateway.turns_exchange_s > 0:
            in_step.start()
        yield
        overdue = threading.Timer(self.settings.gateway.shutdown_grace_s - drain_s(self.settings), _overdue)
        overdue.daemon = True
        overdue.start()  # the stop fits the pod's grace period whatever hangs below (files left upload next start)
        self.tenants.close()  # per project: captures first, then ratings, comparisons, usage, connections
        await in_step.stop()  # bounded (~10 s at most; its threads are daemons); a no-op when it never started
        self.probes.shutdown(wait=False, cancel_futures=True)
        overdue.cancel()

    async def authenticate(self, request: Request, call_next: Any) -> Any:
        if request.url.path not in OPEN_PATHS:  # deny by default: only the probes are open
            given = request.headers.get("authorization", "")
            token = given[7:].strip() if given[:7].lower() == "bearer " else ""
            project = await run_in_threadpool(self.tenants.authenticate, token)
            if project is None:
                return error_response(
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

    async def feedback(self, request: Request) -> dict[str, Any]:
        """A caller's rating of an answer: {"id": "<the completion's id>", "rating": "up"|"down"|"none"}.
        Recorded durably in the caller's project; prep applies it to that turn's captured record."""
        data = api.decode_body(await read_body(request, MAX_FEEDBACK_BYTES))
        if not isinstance(data, dict) or not str(data.get("id", "")).startswith("chatcmpl-"):
            raise api.ApiError(400, 'send {"id": "chatcmpl-...", "rating": "up"|"down"}', param="id")
        if data.get("rating") not in RATINGS:
            raise api.ApiError(400, f"rating: expected one of {', '.join(RATINGS)}", param="rating")
        event = {
            "record_id": data["id"],
            "rating": data["rating"],
            "timestamp": datetime.now(UTC).isoformat(timespec="microseconds"),
        }
        tenant = await run_in_threadpool(self.tenants.tenant, request.state.project)
        try:
            await run_in_threadpool(tenant.ratings.write, event)
        except WriterClosed:  # its project deleted (or the gateway stopping) meanwhile: a 503 to retry, not a 500
            raise closed_error(request.state.project) from None
        return {"id": data["id"], "rating": data["rating"], "recorded": True}

    async def ready(self) -> JSONResponse:
        """Readiness: the backend answers and each route's model is loaded (503 otherwise: no traffic). The
        platform's (`default`) routes are shown; with projects, the gateway is ready when any project's routes
        are (each probed at once, within one budget). An open path: it names no project."""
        loop = asyncio.get_running_loop()
        tried = [self.platform, *(t for t in self.tenants.all() if t is not self.platform)]
        probes = [
            asyncio.wait_for(loop.run_in_executor(self.probes, t.router.readiness), self.ready_budget_s) for t in tried
        ]
        answers = await asyncio.gather(*probes, return_exceptions=True)
        found = [
            a if isinstance(a, dict) else {"ready": False, "backend": "no answer in time", "routes": {}}
            for a in answers
        ]
        ok = any(f["ready"] for f in found)
        return JSONResponse({**found[0], "ready": ok}, status_code=200 if ok else 503)

    async def queue(self, request: Request) -> dict[str, Any]:  # on the event loop, like every use of the turns
        """The turns at the model (gateway/fair.py), totals only: for the gateway's own key (the operator's)."""
        if request.state.project != DEFAULT_PROJECT:
            raise api.ApiError(404, "no such path for a project key", code="not_found")
        return self.fair.snapshot()

    def models(self, request: Request) -> dict[str, Any]:
        """The models of the caller's project only."""
        try:
            targets = self.tenants.tenant(request.state.project).router.targets()
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

    async def chat_completions(self, request: Request) -> Any:
        """OpenAI's chat completions for a tool router: `model` is a route (`champion`, `candidate`, `previous`,
        `base`, `v<N>`), `tools` the offered tools; the answer is one `tool_calls` message (or `content` when no
        tool fits), decoded under the tools' grammar. `stream: true` answers as server-sent events. The turn is
        captured in the caller's project before the answer leaves. Admission: the project's quota, its share of
        the gateway's places and its turn at the model, each a 429 with Retry-After past it."""
        parsed = api.parse_request(await read_body(request, self.settings.gateway.max_request_bytes))
        # the project's tenant (built on its first request) and its limits: file reads, off the event loop
        tenant, limits = await run_in_threadpool(self.tenants.lookup, request.state.project)
        done = await self._admit(request.state.project, tenant, limits)
        if not parsed.stream:
            # the slot is given back when the model's work ends, not when the caller leaves (a cancelled
            # request's thread still runs): the work is its own task, shielded, and calls done() itself
            work = asyncio.ensure_future(run_in_threadpool(tenant.metered.handle, parsed))
            work.add_done_callback(lambda _task: done())
            return JSONResponse(await asyncio.shield(work))
        return await stream_response(tenant.metered, parsed, on_done=done)  # when the generation ends

    async def _admit(self, project: str, tenant: Any, limits: tuple[Any, ...]) -> Callable[[], None]:
        """Admission, in order: the project's quota, its share of the places, the in-flight limit, its turn at the
        model (each refusal gives back what was taken before it). Returns what gives every place back, once."""
        tenant.quota.admit(*limits)  # the project's own quota first: 429 past it (a lock, no I/O, no await)
        try:  # then its share of the gateway's places (gateway/fair.py): a 429 past it
            self.fair.enter(project, self.limit)
        except BaseException:
            tenant.quota.release()
            tenant.quota.queued(0, share=True)
            raise
        if self.inflight >= self.limit:  # refused at once, before any work: the caller retries, nothing is half done
            self.fair.leave(project)
            tenant.quota.release()  # (its request still counts in its requests per minute)
            raise api.too_busy(self.limit)
        self.inflight += 1  # no await between the check and this: two requests never take one slot
        places = _Places(self, project, tenant)
        try:  # its turn at the shared model: fair by project, at most queue_timeout_s
            places.waited = await self.fair.acquire(project)
            if places.waited:
                tenant.quota.queued(places.waited)
        except BaseException as exc:  # timed out (429), or the caller left while waiting: nothing was sent
            places.release()
            if isinstance(exc, api.ApiError):
                tenant.quota.queued(self.fair.timeout_s * 1000, refused=True)
            raise
        return places.release


class _Places:
    """An admitted completion's places: the in-flight count, its fair share and its quota slot, and its turn at
    the model once it has one (`waited` is set)."""

    def __init__(self, gateway: Gateway, project: str, tenant: Any) -> None:
        self.gateway, self.project, self.tenant = gateway, project, tenant
        self.waited: float | None = None

    def release(self) -> None:
        try:
            self.gateway.inflight -= 1
            self.gateway.fair.leave(self.project)
            self.tenant.quota.release()
        finally:  # the slot last, so the next turn sees this request gone
            if self.waited is not None:
                self.gateway.fair.release(self.project)


async def read_body(request: Any, limit: int) -> bytes:
    """The request's body, refused with a 413 as soon as it is over `limit` bytes: by its declared
    Content-Length before reading, else while reading (a chunked body is never read whole). The one
    size check of every body the gateway reads."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise api.too_large(int(declared), limit)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise api.too_large(len(body), limit)
    return bytes(body)
