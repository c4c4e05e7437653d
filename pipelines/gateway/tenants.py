"""One gateway, many AI projects: a caller's key names its project, and the project is all the caller reaches.

`Tenants.authenticate` maps a bearer key to its project: the gateway's own key (`gateway.api_key`) to
`default`, a project key (`flywheel project key create`) to its project by the key's SHA-256 in the project
registry (re-read when the file changes, so a revoked key is refused from the next request on). Each
project gets its own `Tenant`: its router (its Triton models only: `<project>__tool_router_v<N>`, its
serving state), its capture and feedback writers (its raw zone) and its comparisons, built on the first
request. `Quota` holds a project's limits: requests per minute and tokens per UTC day, refused with an
OpenAI-style 429 and `Retry-After`; what each project used per day is kept in its serving zone, one file per
gateway replica (`gateway/usage/<day>/<replica>.json`, written atomically every few seconds by one thread, and at
shutdown: replicas never overwrite each other's counts), which `flywheel project usage` sums and prices and a
restarted replica counts on from. The tokens-per-day limit holds across replicas (each adds the others' counts as
last flushed and read: up to about two flush periods, ~10 s, old); requests per minute and in flight are counted
by each replica alone, so each admits its share of them, ceil(limit / `gateway.replicas`): behind a balancer that
spreads requests evenly the project's total holds (within one request per replica where the limit does not
divide). A replica's name is `gateway.replica` (the cluster's manifests set the pod's name), else
`<host>-<port>`: two gateways on one host never share a file.
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import threading
import time
from collections import deque
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pipelines.config import DEFAULT_PROJECT, Settings

LOG = logging.getLogger("flywheel.gateway")
REGISTRY_TTL_S = 1.0  # how stale the key index may be (a local registry is re-read only when it changed)
FLUSH_EVERY_S = 5.0


USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "compute_ms", "refused_rpm", "refused_tokens",
                "refused_concurrent", "queue_ms", "refused_queue", "refused_share")


def replica_name(settings: Settings) -> str:
    """This gateway process's name in the usage files: `gateway.replica`, else `<host>-<port>`."""
    import re
    import socket

    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:50] or "gateway"
    return settings.gateway.replica or f"{host}-{settings.gateway.port}"


def _counts(record: Any) -> dict[str, int]:
    """A usage record's counts (TypeError / AttributeError / ValueError: not a usage record)."""
    return {field: int(record.get(field) or 0) for field in USAGE_FIELDS}


def usage_uri(settings: Settings, day: str, replica: str) -> str:
    return f"{settings.zone('serving')}/gateway/usage/{day}/{replica}.json"


def usage_by_day(settings: Settings, day: str = "*", exclude: str | None = None) -> dict[str, dict[str, int]]:
    """The project's gateway usage per day, summed over every replica's file (and a day file of the one-file
    layout before replicas, `gateway/usage/<day>.json`); `exclude` leaves one replica out. An unreadable file
    is logged and left out."""
    from pipelines.storage import glob, read_json

    base = f"{settings.zone('serving')}/gateway/usage"
    out: dict[str, dict[str, int]] = {}
    for uri in glob(f"{base}/{day}/*.json") + glob(f"{base}/{day}.json"):
        name = uri.removeprefix(base + "/").removesuffix(".json")
        this_day, _, replica = name.partition("/")
        if exclude is not None and replica == exclude:
            continue
        try:
            counts = _counts(read_json(uri))
        except (OSError, ValueError, TypeError, AttributeError) as exc:  # unreadable, or not a usage record
            LOG.warning("usage %s unreadable: %s", uri, exc)
            continue
        total = out.setdefault(this_day, dict.fromkeys(USAGE_FIELDS, 0))
        for field in USAGE_FIELDS:
            total[field] += counts[field]
    return out


def _today() -> str:
    return datetime.now(timezone.utc).date().isoformat()


class Quota:
    """A project's gateway limits and its day's usage (thread-safe)."""

    def __init__(self, settings: Settings) -> None:
        from pipelines.storage import exists, read_json

        self.settings = settings
        self.replica = replica_name(settings)
        self._lock = threading.Lock()
        self._minute: deque[float] = deque()
        self.day = _today()
        uri = usage_uri(settings, self.day, self.replica)
        try:  # a restarted replica counts on from its own file
            self.used = _counts(read_json(uri) if exists(uri) else {})
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            LOG.warning("usage %s unreadable (%s): counting from zero", uri, exc)
            self.used = dict.fromkeys(USAGE_FIELDS, 0)
        self.others = self._others()
        self._unwritten: dict[str, dict[str, int]] = {}
        self.inflight = 0
        self._dirty, self._flushed = False, time.monotonic()

    def _others(self) -> dict[str, int]:
        """The other replicas' usage of the day as they last flushed it (read off the request path)."""
        try:
            return usage_by_day(self.settings, self.day, exclude=self.replica).get(self.day, {})
        except OSError as exc:  # the last known counts stay
            LOG.warning("the other replicas' usage could not be read: %s", exc)
            return getattr(self, "others", {})

    def _roll(self) -> None:
        today = _today()
        if today != self.day:
            self._flush_locked()
            if self._dirty:  # not written (storage down): kept, and written by a later flush
                self._unwritten[self.day] = self.used
            self.day, self.used, self.others, self._dirty = today, {k: 0 for k in self.used}, {}, False

    def admit(self, rpm: int | None, tokens_per_day: int | None, concurrent: int | None = None) -> None:
        """Count one request, or refuse it (429, Retry-After) when a limit is reached: the project's requests in
        flight, the minute's requests (a sliding window) or the day's tokens (until the next UTC midnight).
        An admitted request holds one of the project's slots until `release`."""
        from pipelines.gateway import openai_api as api

        now = time.monotonic()
        replicas = self.settings.gateway.replicas
        share = (lambda limit: limit if limit is None else -(-limit // replicas))  # noqa: E731 (ceil)
        whose = "its limit" if replicas == 1 else "this gateway replica's share of its limit"
        rpm, concurrent = share(rpm), share(concurrent)
        with self._lock:
            self._roll()
            if concurrent is not None and self.inflight >= concurrent:
                self.used["refused_concurrent"] += 1
                self._dirty = True
                raise api.rate_limited(f"project {self.settings.project} has {concurrent} requests in flight, "
                                       f"{whose}; retry after a second")
            while self._minute and now - self._minute[0] >= 60:
                self._minute.popleft()
            spent = sum(self.used[f] + self.others.get(f, 0) for f in ("prompt_tokens", "completion_tokens"))
            if tokens_per_day is not None and spent >= tokens_per_day:
                self.used["refused_tokens"] += 1
                self._dirty = True
                midnight = datetime.combine(datetime.now(timezone.utc).date() + timedelta(days=1),
                                            datetime.min.time(), tzinfo=timezone.utc)
                wait = max(1, math.ceil((midnight - datetime.now(timezone.utc)).total_seconds()))
                raise api.rate_limited(f"project {self.settings.project} used its {tokens_per_day} tokens of "
                                       f"today (UTC); retry after {wait} s or raise its quota (`flywheel project "
                                       f"quota {self.settings.project} --tokens-per-day N`)", wait,
                                       code="tokens_per_day_exceeded")
            if rpm is not None and len(self._minute) >= rpm:
                self.used["refused_rpm"] += 1
                self._dirty = True
                wait = max(1, math.ceil(60 - (now - self._minute[0])))
                raise api.rate_limited(f"project {self.settings.project} sent {rpm} requests in the last minute, "
                                       f"{whose}; retry after {wait} s", wait)
            self._minute.append(now)
            self.inflight += 1

    def release(self) -> None:
        with self._lock:
            self.inflight -= 1

    def queued(self, wait_ms: float, refused: bool = False, share: bool = False) -> None:
        """Time this project's requests waited for their turn at the shared model (gateway/fair.py), the
        requests refused for waiting too long (`refused`) and those refused past its share of the gateway's
        places (`share`)."""
        with self._lock:
            self._roll()
            self.used["queue_ms"] += int(wait_ms)
            self.used["refused_queue"] += int(refused)
            self.used["refused_share"] += int(share)
            self._dirty = True

    def charge(self, body: dict[str, Any] | None, compute_ms: float) -> None:
        usage = (body or {}).get("usage") or {}
        with self._lock:
            self._roll()
            self.used["requests"] += 1
            self.used["prompt_tokens"] += int(usage.get("prompt_tokens") or 0)
            self.used["completion_tokens"] += int(usage.get("completion_tokens") or 0)
            self.used["compute_ms"] += int(compute_ms)
            self._dirty = True

    def flush(self) -> None:
        """This replica's counts written (when they changed), the other replicas' read again."""
        with self._lock:
            self._flush_locked()
            day = self.day
        others = self._others()  # file reads outside the lock: requests are admitted meanwhile
        with self._lock:
            if self.day == day:
                self.others = others

    def _write(self, day: str, used: dict[str, int]) -> None:
        from pipelines.storage import write_json

        write_json(usage_uri(self.settings, day, self.replica),
                   {**used, "day": day, "project": self.settings.project, "replica": self.replica})

    def _flush_locked(self) -> None:
        for day, used in list(self._unwritten.items()):  # an earlier day's counts a failed write left behind
            try:
                self._write(day, used)
                del self._unwritten[day]
            except OSError as exc:
                LOG.warning("usage of %s not written: %s", day, exc)
        if not self._dirty:
            return
        try:
            self._write(self.day, self.used)
            self._dirty, self._flushed = False, time.monotonic()
        except OSError as exc:  # the count stays in memory; the next flush tries again
            LOG.warning("usage not written: %s", exc)


class Metered:
    """A project's traffic, counted: what `stream_response` and the sync path call (`handle`)."""

    def __init__(self, traffic: Any, quota: Quota) -> None:
        self.traffic, self.quota, self.settings = traffic, quota, traffic.settings

    def handle(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        started = time.perf_counter()
        body = None
        try:
            body = self.traffic.handle(*args, **kwargs)
            return body
        finally:
            self.quota.charge(body, (time.perf_counter() - started) * 1000)


class Tenant:
    """Everything the gateway keeps for one project."""

    def __init__(self, settings: Settings) -> None:
        from pipelines.gateway.capture import CaptureWriter, expire
        from pipelines.gateway.router import Router
        from pipelines.gateway.traffic import Traffic, agreement_zone
        from pipelines.logs.feedback import feedback_zone

        self.settings = settings
        self.router = Router(settings)
        raw_zone = settings.zone("raw")  # a local spool (object storage only) per raw zone: never another's
        spool = Path.home() / ".flywheel" / "gateway-spool" / hashlib.sha1(raw_zone.encode()).hexdigest()[:12]
        self.capture = (CaptureWriter(raw_zone, settings.gateway.capture_rotate_bytes, spool)
                        if settings.gateway.capture else None)
        self.traffic = Traffic(settings, self.router, self.capture, spool)
        for zone in (f"{settings.zone('serving')}/gateway/unusable", agreement_zone(settings)):
            try:  # what the gateway keeps at rest outside the raw zone expires (gateway.retention_days)
                expire(zone, settings.gateway.retention_days)
            except OSError as exc:
                LOG.warning("could not expire %s: %s", zone, exc)
        self.ratings = CaptureWriter(feedback_zone(raw_zone), settings.gateway.capture_rotate_bytes, spool / "feedback")
        self.quota = Quota(settings)
        self.metered = Metered(self.traffic, self.quota)

    def close(self, keep_usage: bool = True) -> None:
        if self.capture is not None:
            self.capture.close()  # the open capture file first (uploaded, on object storage): no request is left
        self.ratings.close()
        self.traffic.close()  # then the off-path comparisons (the running one finishes; queued ones are dropped)
        if keep_usage:
            self.quota.flush()


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
        while not self._stop.wait(FLUSH_EVERY_S):
            for tenant in self.all():
                try:
                    tenant.quota.flush()
                except Exception:  # noqa: BLE001 (one project's bad usage never stops the others' counting)
                    LOG.exception("usage of project %s not flushed", tenant.settings.project)

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
            try:
                projects = registry.load(self.settings)
                keys = {k.sha256: p.name for p in projects.values() for k in p.active_keys()}
                quotas = {p.name: p.quotas for p in projects.values()}
            except Exception as exc:  # noqa: BLE001 (a half-edited registry: the last index serves)
                LOG.warning("the project registry could not be read (%s); the last keys serve", exc)
                now_stamp = stamp
            self._index = (time.monotonic(), now_stamp, keys, quotas)
        for gone in [name for name in list(self._tenants) if name not in quotas]:
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
        from pipelines.projects import settings_for

        found = self._tenants.get(project)
        if found is not None:
            return found
        with self._lock:
            if project not in self._tenants:
                self._tenants[project] = Tenant(settings_for(self.settings, project))
            return self._tenants[project]

    def lookup(self, project: str) -> tuple[Tenant, tuple[int | None, int | None, int | None]]:
        """The project's tenant and its limits (rpm, tokens_per_day, concurrent): `tenant.quota.admit(*limits)`
        checks them (429 past one) and takes a slot the caller gives back with `tenant.quota.release()`."""
        quotas = self.quotas(project)
        return self.tenant(project), (getattr(quotas, "rpm", None), getattr(quotas, "tokens_per_day", None),
                                      getattr(quotas, "concurrent", None))

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

    def close(self) -> None:
        self._stop.set()
        self._flusher.join(timeout=30)
        for tenant in self.all():
            tenant.close()
