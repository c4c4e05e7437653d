"""The gateway's routing: OpenAI model names (aliases: `champion`, `candidate`, `previous`, `base`, `vN`) to the
Triton models loaded now, the prompt each was trained with, its readiness, few-shot shots and context."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from pipelines.config import Settings

LOG = logging.getLogger("flywheel.gateway")
ALIAS_TTL_S = 10.0
# the routing table (Triton's loaded models + the serving state) is rebuilt when the serving state changes (a
# deploy, rollback or canary rewrites it), or after this long (Triton restarted, a model unloaded by hand,
# the state on object storage where there is no cheap change check), never on every request
TARGETS_TTL_S = 5.0
TARGETS_RETRY_S = 1.0  # after a failed rebuild (Triton down), the next try waits this long
# a failed rebuild serves the last table only while the serving state is unchanged and for this long at most:
# after a deploy or a rollback, or once it is this old, requests fail (503) rather than go to the wrong model
TARGETS_STALE_S = 60.0


@dataclass(frozen=True)
class Target:
    alias: str
    name: str  # the Triton model
    version: str | None  # the registry version (None: the base model)
    prompt_style: str


class Router:
    """Aliases -> loaded Triton models, through one Triton client (a connection per worker thread inside it)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._local = threading.local()  # a FeatureStore per worker thread
        self._stores: list[Any] = []  # every thread's, so `close` can close them all
        self._stores_lock = threading.Lock()
        self._lock = threading.Lock()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._styles: dict[str, str] = {}
        self._candidate: tuple[float, str | None] = (0.0, None)
        self._refreshing = threading.Lock()
        self._pool: tuple[list[Any], Any] | None = None
        self._warned = 0.0
        self._targets: tuple[float, Any, dict[str, Target]] | None = None  # (built at, state stamp, table)
        self._targets_lock = threading.Lock()
        self._targets_failed: tuple[float, str | None] = (0.0, None)
        self._forget_inputs = False
        self._invalidated_at = float("-inf")  # a table built (started) before this is out of date

    def close(self) -> None:
        """The Triton client's connections and every thread's Feast store (a project's tenant closed, a deleted
        project: no socket stays open)."""
        from pipelines.clients.feast import close_store

        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()
        with self._stores_lock:
            stores, self._stores = self._stores, []
        for store in stores:
            close_store(store)

    def client(self) -> Any:
        """The one Triton client of this gateway (it keeps a connection per calling thread itself)."""
        from pipelines.serve.client import TritonClient

        with self._client_lock:
            if self._client is None:
                self._client = TritonClient(self.settings, timeout_s=self.settings.gateway.request_timeout_s)
            return self._client

    def _style(self, name: str) -> str:
        from pipelines.serve import shared_base

        if name not in self._styles:
            self._styles[name] = shared_base.prompt_style(self.settings, name)
        return self._styles[name]

    def _candidate_version(self) -> str | None:
        """The registry's `candidate` version, refreshed every ALIAS_TTL_S by one thread at a time (the others
        use the value they have meanwhile; the registry unreachable: the last known one)."""
        from pipelines.registry.models import alias_version

        at, version = self._candidate
        if time.monotonic() - at > ALIAS_TTL_S and self._refreshing.acquire(blocking=False):
            try:
                version = alias_version(self.settings, "candidate")
            except Exception:  # noqa: BLE001 (the registry unreachable: keep the last known candidate)
                LOG.warning("the registry did not answer; the candidate route stays v%s", version)
            finally:
                self._candidate = (time.monotonic(), version)
                self._refreshing.release()
        return version

    def invalidate(self) -> None:
        """The routing table is out of date (a model error): the next request rebuilds it, and reads the models'
        declared inputs afresh; meanwhile the others keep using it."""
        self._invalidated_at = time.monotonic()  # a rebuild already under way started earlier: it is stale too
        self._forget_inputs = True

    def _fresh(self, cached: tuple[float, Any, dict[str, Target]] | None, stamp: Any) -> bool:
        return bool(
            cached
            and cached[1] == stamp
            and cached[0] > self._invalidated_at
            and time.monotonic() - cached[0] < TARGETS_TTL_S
        )

    def _usable(self, cached: tuple[float, Any, dict[str, Target]] | None, stamp: Any) -> bool:
        """A table to serve while a rebuild fails: the serving state unchanged since it was built, and young."""
        return bool(cached and cached[1] == stamp and time.monotonic() - cached[0] < TARGETS_STALE_S)

    def targets(self) -> dict[str, Target]:
        """Every alias that a loaded model answers now: cached until the serving state changes, a model error,
        or TARGETS_TTL_S. One request rebuilds it while the others use the last table; with none yet, they
        wait for it (a bounded wait). A failed rebuild keeps the last table (only while the serving state is
        unchanged, for TARGETS_STALE_S at most) and is retried after TARGETS_RETRY_S; without one, the requests
        of that second fail at once."""
        from pipelines.serve import deploy

        stamp = deploy.state_stamp(self.settings)
        cached = self._targets  # one reference swap: read without the lock
        if cached is not None and self._fresh(cached, stamp):
            return cached[2]
        if cached is not None and not self._targets_lock.acquire(blocking=False):
            return cached[2]  # another request is rebuilding it
        if not cached and not self._targets_lock.acquire(timeout=self.settings.gateway.request_timeout_s):
            raise TimeoutError("the routing table is still being built by another request")
        try:
            cached = self._targets
            if cached is not None and self._fresh(cached, stamp):
                return cached[2]  # rebuilt while this request waited
            failed_at, failure = self._targets_failed
            if failure and time.monotonic() - failed_at < TARGETS_RETRY_S:
                if cached is not None and self._usable(cached, stamp):
                    return cached[2]
                raise RuntimeError(f"the model server did not answer a moment ago ({failure})")
            if (self._forget_inputs or (cached and cached[1] != stamp)) and self._client is not None:
                self._client.forget_inputs()  # a deploy or a restart may have replaced a model folder
                self._forget_inputs = False
            started = time.monotonic()
            try:
                built = self._build_targets()
            except Exception as exc:
                self._targets_failed = (time.monotonic(), f"{type(exc).__name__}: {str(exc)[:200]}")
                if cached is not None and self._usable(cached, stamp):
                    LOG.warning(
                        "the routing table could not be rebuilt (%s); the last one serves meanwhile",
                        self._targets_failed[1],
                    )
                    return cached[2]
                raise
            self._targets, self._targets_failed = (started, stamp, built), (0.0, None)
            return built
        finally:
            self._targets_lock.release()

    def _build_targets(self) -> dict[str, Target]:
        from pipelines.serve import deploy, repository, shared_base

        loaded = set(self.client().loaded())
        out: dict[str, Target] = {}
        for name in sorted(loaded):
            version = shared_base.own_version(self.settings, name)  # this project's model or its adapter on a base
            if version is not None:
                out[f"v{version}"] = Target(f"v{version}", name, version, self._style(name))
        current = deploy.state(self.settings)
        for alias in ("live", "previous"):
            entry = current.get(alias)
            if entry and entry["name"] in loaded:
                key = "champion" if alias == "live" else alias
                out[key] = Target(key, entry["name"], entry.get("version"), entry["prompt_style"])
        candidate = self._candidate_version()
        if candidate and f"v{candidate}" in out:
            out["candidate"] = Target(
                "candidate", out[f"v{candidate}"].name, candidate, out[f"v{candidate}"].prompt_style
            )
        base = repository.triton_name(self.settings, None)
        if base in loaded:
            out["base"] = Target("base", base, None, "full")
        return out

    def readiness(self) -> dict[str, Any]:
        """Whether the gateway can answer now: Triton reachable, the champion loaded, and every route's
        candidate (shadow, canary) loaded; each route's state by name."""
        from pipelines.livegate.routes import read_routes

        try:
            targets = self._build_targets()  # a probe looks now, never at the cached table
        except Exception as exc:  # noqa: BLE001 (Triton down or the serving state unreadable: not ready)
            return {"ready": False, "backend": f"unreachable ({type(exc).__name__})", "routes": {}}
        routes = {"champion": "ready" if "champion" in targets else "no live model loaded"}
        try:
            configured = read_routes(self.settings)["routes"]
        except Exception as exc:  # noqa: BLE001 (a torn routes file: traffic serves every route plainly, say so)
            configured, routes["routes_file"] = {}, f"unreadable ({type(exc).__name__}); every route serves"
        for alias, route in sorted(configured.items()):
            if route.get("mode") in ("shadow", "canary"):
                candidate = route.get("candidate", "candidate")
                ok = alias in targets and candidate in targets
                routes[alias] = f"{route['mode']}: {'ready' if ok else f'{candidate} not loaded'}"
        return {
            "ready": all(v == "ready" or v.endswith(": ready") or k == "routes_file" for k, v in routes.items()),
            "backend": "ready",
            "routes": routes,
        }

    def resolve(self, model: str) -> Target:
        from pipelines.gateway.openai_api import ApiError

        try:
            found = self.targets().get(model)
        except Exception as exc:  # noqa: BLE001 (Triton or the serving state unreadable: retry later)
            raise ApiError(
                503,
                f"the models cannot be listed now ({type(exc).__name__}: {str(exc)[:200]})",
                kind="server_error",
                code="model_unavailable",
            ) from None
        if found is None:
            raise ApiError(
                404,
                f"The model '{model}' does not exist or is not loaded (GET /v1/models lists the ones that are)",
                param="model",
                code="model_not_found",
            )
        return found

    def turns(self, target: Target, row: dict[str, Any]) -> list[dict[str, str]]:
        """The prompt the model was trained on; for `base`, the full prompt with retrieved examples."""
        from pipelines.serve.prompts import conversation

        turns = conversation({**row, "context": self.context(row["customer_id"])}, target.prompt_style)
        if target.version is not None or self.settings.gateway.few_shot == 0:
            return turns
        from pipelines.toolcall.examples import Example
        from pipelines.toolcall.fewshot import with_shots

        query = Example(row["record_id"], turns, '{"name":null}', "", turns[-1]["content"], row["tools_json"])
        pool, vectors = self._shot_pool()
        return with_shots([query], pool, self.settings.gateway.few_shot, vectors)[0]

    def context(self, customer_id: str) -> str:
        """The customer's context line from Feast's online store, as training had it; empty (as for a
        customer training never saw) when there is no customer or the store cannot answer, logged."""
        from pipelines.clients.feast import feature_store
        from pipelines.features.pipeline import online_context

        if not customer_id:
            return ""
        try:
            if not hasattr(self._local, "store"):  # one FeatureStore per worker thread (its registry is cached)
                self._local.store = feature_store(self.settings)
                with self._stores_lock:
                    self._stores.append(self._local.store)
            return online_context(customer_id, self.settings, self._local.store)
        except Exception as exc:  # noqa: BLE001 (Feast unreachable or not applied: serve without context)
            now = time.monotonic()
            if now - self._warned > 60:
                self._warned = now
                LOG.warning(
                    "no customer context from the online store (%s: %s); serving without it",
                    type(exc).__name__,
                    str(exc)[:200],
                )
            return ""

    def _shot_pool(self) -> tuple[list[Any], Any]:
        """Training examples (every turn) to retrieve from (none before a training set exists) and their
        embeddings, computed once (embedding the pool per request would cost seconds on a CPU)."""
        from pipelines.embeddings import embed
        from pipelines.prep.dataset import DatasetMissing, load_split
        from pipelines.toolcall.examples import to_examples
        from pipelines.toolcall.fewshot import retrieval_key, shot_pool

        with self._lock:
            if self._pool is None:
                try:
                    pool = shot_pool(to_examples(load_split(self.settings, "train", 2000), "full"))
                except DatasetMissing:
                    pool = []
                self._pool = (pool, embed([retrieval_key(p) for p in pool]) if pool else None)
            return self._pool
