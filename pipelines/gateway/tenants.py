"""One gateway, many AI projects: a caller's key names its project, and the project is all the caller reaches.

`Tenants.authenticate` maps a bearer key to its project: the gateway's own key (`gateway.api_key`) to
`default`, a project key (`flywheel project key create`) to its project by the key's SHA-256 in the project
registry (re-read when the file changes, so a revoked key is refused from the next request on). Each
project gets its own `Tenant`: its router (its Triton models only: `<project>__tool_router_v<N>`, its
serving state), its capture and feedback writers (its raw zone) and its comparisons, built on the first
request. `Quota` (`quota.py`) holds a project's limits and its usage.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from pipelines.admission.quota import FLUSH_EVERY_S, Quota
from pipelines.config import DEFAULT_PROJECT, Settings

LOG = logging.getLogger("flywheel.gateway")
FLUSH_JOIN_S = 5.0  # the flusher's last cycle at close: within the pod's grace period
REGISTRY_TTL_S = 1.0  # how stale the key index may be (a local registry is re-read only when it changed)


def closed_error(project: str) -> Exception:
    """The 503 a request of a closed project gets (deleted, or the gateway is stopping): the caller retries, then
    gets a 401 once its key is gone."""
    from pipelines.gateway.openai_api import ApiError

    return ApiError(
        503,
        f"project {project} is closed (deleted, or the gateway is stopping): retry",
        kind="server_error",
        code="project_closed",
    )


class Metered:
    """A project's traffic, counted: what `stream_response` and the sync path call (`handle`)."""

    def __init__(self, traffic: Any, quota: Quota) -> None:
        self.traffic, self.quota, self.settings = traffic, quota, traffic.settings

    def handle(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        from pipelines.gateway.capture import WriterClosed

        started = time.perf_counter()
        body = None
        try:
            body = self.traffic.handle(*args, **kwargs)
            return body
        except WriterClosed:  # its project was deleted (or the gateway is stopping) while the request ran
            raise closed_error(self.settings.project) from None
        finally:
            self.quota.charge(body, (time.perf_counter() - started) * 1000)


class Tenant:
    """Everything the gateway keeps for one project."""

    def __init__(self, settings: Settings) -> None:
        from pipelines.gateway.capture import CaptureWriter, expire
        from pipelines.gateway.router import Router
        from pipelines.gateway.traffic import Traffic
        from pipelines.livegate.comparisons import agreement_zone
        from pipelines.logs.feedback import feedback_zone

        self.settings = settings
        self.router = Router(settings)
        raw_zone = settings.zone("raw")  # a local spool (object storage only) per raw zone: never another's
        spool = (
            Path.home()
            / ".flywheel"
            / "gateway-spool"
            / hashlib.sha1(raw_zone.encode(), usedforsecurity=False).hexdigest()[:12]
        )
        every = settings.gateway.capture_upload_every_s
        self.capture = (
            CaptureWriter(raw_zone, settings.gateway.capture_rotate_bytes, spool, every)
            if settings.gateway.capture
            else None
        )
        self.traffic = Traffic(settings, self.router, self.capture, spool)
        for zone in (f"{settings.zone('serving')}/gateway/unusable", agreement_zone(settings)):
            try:  # what the gateway keeps at rest outside the raw zone expires (gateway.retention_days)
                expire(zone, settings.gateway.retention_days)
            except OSError as exc:
                LOG.warning("could not expire %s: %s", zone, exc)
        self.ratings = CaptureWriter(
            feedback_zone(raw_zone), settings.gateway.capture_rotate_bytes, spool / "feedback", every
        )
        self.quota = Quota(settings)
        self.metered = Metered(self.traffic, self.quota)

    def rotate_old(self) -> None:
        """Captures and ratings older than gateway.capture_upload_every_s closed and uploaded (the flusher calls it)."""
        for writer in (self.capture, self.ratings, self.traffic.comparisons, self.traffic.unusable):
            if writer is not None:
                writer.rotate_old()

    def close(self, keep_usage: bool = True) -> list[str]:
        """Captures first (uploaded, on object storage: no acknowledged turn is left behind), then ratings, the
        comparisons (the running one is not waited for: they are off the request path), the usage, the
        connections to Triton and Feast. Each step is tried whatever the one before it did; the failures are
        returned (and logged)."""
        failures: list[str] = []
        steps = [
            ("captures", self.capture.close if self.capture is not None else None),
            ("ratings", self.ratings.close),
            ("comparisons", self.traffic.close),
            ("usage", self.quota.flush if keep_usage else None),
            ("connections", self.router.close),
        ]
        for what, step in steps:
            if step is None:
                continue
            try:
                left = step()
                failures += [f"{what}: {f}" for f in left] if isinstance(left, list) else []
            except Exception as exc:  # noqa: BLE001 (the next step still runs: nothing else is lost)
                failures.append(f"{what}: {type(exc).__name__}: {exc}")
        for failure in failures:
            LOG.warning("project %s at close: %s", self.settings.project, failure)
        return failures


class Tenants:
    """Keys -> projects -> tenants, for one gateway process."""

    def __init__(self, settings: Settings, default_key: str) -> None:
        self.settings = settings  # the platform's (unscoped)
        self._default_key = default_key.encode()
        self._tenants: dict[str, Tenant] = {}
        self._lock = threading.Lock()
        self._index: tuple[float, Any, dict[str, str], dict[str, Any]] = (float("-inf"), None, {}, {})
        self._index_lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher = threading.Thread(target=self._flush_every, name="usage-flush", daemon=True)
        self._flusher.start()

    def _flush_every(self) -> None:
        """Every project's usage (answers and refusals) written every FLUSH_EVERY_S, off the request path."""
        cycle = FLUSH_EVERY_S
        while not self._stop.wait(FLUSH_EVERY_S):
            started = time.monotonic()
            for tenant in self.all():
                try:
                    tenant.quota.live_s = 3 * cycle  # the others count this replica's flight that long
                    tenant.quota.flush()
                    tenant.rotate_old()  # acknowledged turns reach the raw zone within capture_upload_every_s
                except Exception:  # noqa: BLE001 (one project's bad usage never stops the others' counting)
                    LOG.exception("usage or captures of project %s not flushed", tenant.settings.project)
            cycle = FLUSH_EVERY_S + time.monotonic() - started  # many projects on object storage: longer

    def _registry(self) -> tuple[dict[str, str], dict[str, Any]]:
        """(key digest -> project, project -> quotas). A local registry is re-read whenever its file changed
        (one stat per request: a revoked key is refused from the next request on); one on object storage at
        most every REGISTRY_TTL_S. A registry that cannot be read keeps the last index (logged). A project
        that left the registry (deleted) loses its tenant: its writers are closed, nothing more is written."""
        import os

        from pipelines.projects import registry

        uri = registry.registry_uri(self.settings)
        local = "://" not in uri or uri.startswith("file://")
        at, stamp, keys, quotas = self._index
        if not local and time.monotonic() - at < REGISTRY_TTL_S:
            return keys, quotas
        try:
            found = os.stat(uri.removeprefix("file://")) if local else None
            now_stamp = (found.st_mtime_ns, found.st_size, found.st_ino) if found else None
        except FileNotFoundError:
            now_stamp = (0, 0, 0)
        if local and now_stamp == stamp:
            return keys, quotas
        with self._index_lock:
            if self._index[1] == now_stamp and local:
                return self._index[2], self._index[3]  # another request re-read it meanwhile
            read = False
            try:
                projects = registry.load(self.settings)
                keys = {k.sha256: p.name for p in projects.values() for k in p.active_keys()}
                quotas = {p.name: p.quotas for p in projects.values()}
                read = True
            except Exception as exc:  # noqa: BLE001 (a half-edited registry, a blip: the last index serves)
                LOG.warning("the project registry could not be read (%s); the last keys serve", exc)
                now_stamp = stamp
            self._index = (time.monotonic(), now_stamp, keys, quotas)
        if not read:  # what could not be read says nothing about which projects are gone
            return keys, quotas
        gone_now = [name for name in list(self._tenants) if name not in quotas and name != DEFAULT_PROJECT]
        for gone in gone_now:
            with self._lock:
                tenant = self._tenants.pop(gone, None)
            if tenant is not None:
                LOG.info("project %s left the registry: its tenant is closed", gone)
                tenant.close(keep_usage=False)  # its zones moved away: nothing is written there again
        return keys, quotas

    def authenticate(self, token: str) -> str | None:
        """The caller's project, or None (no such key, or a revoked one)."""
        if not token:
            return None
        if secrets.compare_digest(token.encode(), self._default_key):
            return DEFAULT_PROJECT
        keys, _ = self._registry()
        return keys.get(hashlib.sha256(token.encode()).hexdigest())  # a dict lookup by digest: no timing leak

    def quotas(self, project: str) -> Any:
        return self._registry()[1].get(project)

    def tenant(self, project: str) -> Tenant:
        """The project's tenant, built on its first request; a project the registry no longer holds (deleted while
        its request was on the way) gets the 503 `project_closed`, and nothing is built for it."""
        from pipelines.projects import settings_for

        found = self._tenants.get(project)
        if found is not None:
            return found
        if project != DEFAULT_PROJECT and project not in self._registry()[1]:
            raise closed_error(project)
        with self._lock:
            if project not in self._tenants:
                self._tenants[project] = Tenant(settings_for(self.settings, project))
            return self._tenants[project]

    def lookup(self, project: str) -> tuple[Tenant, tuple[int | None, int | None, int | None]]:
        """The project's tenant and its limits (rpm, tokens_per_day, concurrent): `tenant.quota.admit(*limits)`
        checks them (429 past one) and takes a slot the caller gives back with `tenant.quota.release()`."""
        quotas = self.quotas(project)
        return self.tenant(project), (
            getattr(quotas, "rpm", None),
            getattr(quotas, "tokens_per_day", None),
            getattr(quotas, "concurrent", None),
        )

    def serving(self) -> list[str]:
        """Build the tenant of every project with a live deployment (at start); the projects' names."""
        from pipelines.projects import registry, settings_for
        from pipelines.serve import deploy

        live = []
        for name in registry.load(self.settings):
            try:
                if deploy.state(settings_for(self.settings, name)).get("live"):
                    self.tenant(name)
                    live.append(name)
            except Exception as exc:  # noqa: BLE001 (one project's broken state never keeps the gateway down)
                LOG.warning("project %s: serving state unreadable (%s)", name, exc)
        return live

    def all(self) -> list[Tenant]:
        return list(self._tenants.values())

    def close(self) -> list[str]:
        """Every project's tenant closed, each whatever the others did (`Tenant.close`); the failures."""
        self._stop.set()
        self._flusher.join(timeout=FLUSH_JOIN_S)
        failures: list[str] = []
        for tenant in self.all():
            failures += [f"{tenant.settings.project}: {f}" for f in tenant.close()]
        return failures
