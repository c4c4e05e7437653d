"""A project's gateway limits and usage, per gateway replica and across them.

`Quota` holds a project's limits: requests per minute, requests in flight and tokens per UTC day, each refused
with an OpenAI-style 429 and `Retry-After`. What each project used per day is kept in its serving zone, one file
per gateway replica (`gateway/usage/<day>/<replica>.json`, written atomically every few seconds by one thread,
and at shutdown: replicas never overwrite each other's counts), which `flywheel project usage` sums and prices
and a restarted replica counts on from. Every limit holds across replicas, however the balancer spreads the
requests (one client's kept-alive connection stays on one replica: it gets the whole limit): each replica's
file also holds its requests of the last minute (per second) and its requests in flight, and a replica admits a
request only while its own counts and the others' (as last flushed and read: up to about two flush periods,
~10 s, old) are under the limit. Replicas admitting at the same moment can therefore pass a limit by what each
admitted since it last read the others', and a request refused for the others' flight is told to retry after a
flush period (their news). A replica whose file is older than its live span (three of its flush cycles, LIVE_S
at least: stopped, or rescheduled under a new name) no longer counts as in flight; its requests of the minute
count until they are a minute old, and in the minute after midnight (UTC) the day before's files still count.
A replica's name is `gateway.replica` (the cluster's manifests set the pod's name), else `<host>-<port>`: two
gateways on one host never share a file.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from datetime import UTC, datetime, timedelta
from typing import Any

from pipelines.config import Settings

LOG = logging.getLogger("flywheel.gateway")
FLUSH_EVERY_S = 5.0
LIVE_S = 3 * FLUSH_EVERY_S  # a replica's requests in flight count while its file is younger than this (at least)
MAX_MINUTE = 1_000_000  # more requests than this in one second of a usage file: not a usage record


USAGE_FIELDS = (
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "compute_ms",
    "refused_rpm",
    "refused_tokens",
    "refused_concurrent",
    "queue_ms",
    "refused_queue",
    "refused_share",
)


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


def _minute_of(record: Any, wall: float) -> list[tuple[float, int]]:
    """A usage record's requests of the last minute (before `wall`): (unix second, count) pairs. ValueError or
    TypeError when they are not pairs of a finite second and a count from 0 to MAX_MINUTE."""
    pairs = record.get("minute") or [] if isinstance(record, dict) else []
    out = []
    for second, n in pairs:
        second, n = float(second), int(n)
        if not math.isfinite(second) or not 0 <= n <= MAX_MINUTE:
            raise ValueError(f"minute entry ({second}, {n}) is not a second and a count")
        if wall - second < 60 and n:
            out.append((second, n))
    return out


def _live_of(record: Any, wall: float) -> tuple[float, int, list[tuple[float, int]]]:
    """A replica file's (written at, requests in flight while it counts as live, requests of the minute);
    ValueError or TypeError when malformed. A file older than its `live_s` (3 flush cycles) counts no flight."""
    at, inflight = float(record.get("at") or 0), int(record.get("inflight") or 0)
    live_s = float(record.get("live_s") or LIVE_S)
    if not (math.isfinite(at) and math.isfinite(live_s)) or inflight < 0:
        raise ValueError(f"at {at}, live_s {live_s} and inflight {inflight} are not a time, a span and a count")
    return at, (inflight if wall - at < live_s else 0), _minute_of(record, wall)


Live = tuple[str, float, int, list[tuple[float, int]]]  # a replica, when its file was written, its flight, its minute


def usage_by_day(
    settings: Settings, day: str = "*", exclude: str | None = None, live: list[Live] | None = None
) -> dict[str, dict[str, int]]:
    """The project's gateway usage per day, summed over every replica's file (and a day file of the one-file
    layout before replicas, `gateway/usage/<day>.json`); `exclude` leaves one replica out. An unreadable file
    is logged and left out. `live`, when given, receives each replica file's (replica, `_live_of`): when it was
    written, its flight while live, its minute."""
    from pipelines.storage import glob, read_json

    base = f"{settings.zone('serving')}/gateway/usage"
    out: dict[str, dict[str, int]] = {}
    for uri in glob(f"{base}/{day}/*.json") + glob(f"{base}/{day}.json"):
        name = uri.removeprefix(base + "/").removesuffix(".json")
        this_day, _, replica = name.partition("/")
        if exclude is not None and replica == exclude:
            continue
        try:
            record = read_json(uri)
            counts = _counts(record)
            if live is not None and replica:  # a malformed minute or flight: the file is unreadable, not half-read
                live.append((replica, *_live_of(record, time.time())))
        except (OSError, ValueError, TypeError, AttributeError) as exc:  # unreadable, or not a usage record
            LOG.warning("usage %s unreadable: %s", uri, exc)
            continue
        total = out.setdefault(this_day, dict.fromkeys(USAGE_FIELDS, 0))
        for field in USAGE_FIELDS:
            total[field] += counts[field]
    return out


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


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
        record: Any = {}
        try:  # a restarted replica counts on from its own file (its day, and its requests of the last minute)
            record = read_json(uri) if exists(uri) else {}
            self.used = _counts(record)
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            LOG.warning("usage %s unreadable (%s): counting from zero", uri, exc)
            self.used = dict.fromkeys(USAGE_FIELDS, 0)
        try:
            wall, now = time.time(), time.monotonic()
            for second, n in sorted(_minute_of(record, wall)):
                self._minute.extend([now - (wall - second)] * n)
        except (ValueError, TypeError, AttributeError) as exc:  # the day's counts stay
            LOG.warning("usage %s: the last minute unreadable (%s)", uri, exc)
        self.live_s = LIVE_S  # how long the others count this replica's flight: 3 flush cycles (Tenants measures)
        self.others, self.others_minute, self.others_inflight = self._others()
        self._unwritten: dict[str, dict[str, Any]] = {}  # an earlier day's last record, not written yet
        self._writing = threading.Lock()  # one flush writes at a time (never an older record over a newer)
        self.inflight = 0
        self._dirty = False

    def _others(self) -> tuple[dict[str, int], list[tuple[float, int]], int]:
        """The other replicas' usage of the day, their requests of the last minute ((unix second, count) pairs)
        and in flight, as they last flushed them (read off the request path). Within a minute after midnight
        (UTC) the day before's files count for the minute and the flight too (a replica that has not rolled
        yet, or the minute before midnight)."""
        live: list[Live] = []
        try:
            counts = usage_by_day(self.settings, self.day, exclude=self.replica, live=live).get(self.day, {})
            wall = time.time()
            midnight = datetime.fromisoformat(self.day).replace(tzinfo=UTC).timestamp()
            if wall - midnight < 60:
                before = (datetime.fromisoformat(self.day) - timedelta(days=1)).date().isoformat()
                usage_by_day(self.settings, before, exclude=self.replica, live=live)
        except OSError as exc:  # the last known counts stay
            LOG.warning("the other replicas' usage could not be read: %s", exc)
            return (
                getattr(self, "others", {}),
                getattr(self, "others_minute", []),
                getattr(self, "others_inflight", 0),
            )
        latest: dict[str, tuple[float, int, list[tuple[float, int]]]] = {}  # per replica, its latest file
        for name, at, inflight, minute in live:
            if name not in latest or at > latest[name][0]:
                latest[name] = (at, inflight, minute)
        return (
            counts,
            [pair for _, _, minute in latest.values() for pair in minute],
            sum(inflight for _, inflight, _ in latest.values()),
        )

    def _roll(self) -> None:
        """At midnight (UTC): the day's last record kept for the next flush to write, the new day from zero."""
        today = _today()
        if today != self.day:
            if self._dirty or self.inflight:
                self._unwritten[self.day] = self._record(self.day, live=True)
            self.day, self.used, self.others, self._dirty = today, dict.fromkeys(self.used, 0), {}, False

    def admit(self, rpm: int | None, tokens_per_day: int | None, concurrent: int | None = None) -> None:
        """Count one request, or refuse it (429, Retry-After) when a limit is reached: the project's requests in
        flight, the minute's requests (a sliding window) or the day's tokens (until the next UTC midnight).
        An admitted request holds one of the project's slots until `release`."""
        from pipelines import api_errors as api

        with self._lock:
            now, wall = time.monotonic(), time.time()
            self._roll()
            if concurrent is not None and self.inflight + self.others_inflight >= concurrent:
                self.used["refused_concurrent"] += 1
                self._dirty = True
                # the others' flight is re-read every flush: a request they ended frees its place by then
                wait = 1 if self.inflight >= concurrent else math.ceil(FLUSH_EVERY_S)
                raise api.rate_limited(
                    f"project {self.settings.project} has {concurrent} requests in flight, its "
                    f"limit; retry after {wait} s",
                    wait,
                )
            while self._minute and now - self._minute[0] >= 60:
                self._minute.popleft()
            spent = sum(self.used[f] + self.others.get(f, 0) for f in ("prompt_tokens", "completion_tokens"))
            if tokens_per_day is not None and spent >= tokens_per_day:
                self.used["refused_tokens"] += 1
                self._dirty = True
                midnight = datetime.combine(
                    datetime.now(UTC).date() + timedelta(days=1), datetime.min.time(), tzinfo=UTC
                )
                wait = max(1, math.ceil((midnight - datetime.now(UTC)).total_seconds()))
                raise api.rate_limited(
                    f"project {self.settings.project} used its {tokens_per_day} tokens of "
                    f"today (UTC); retry after {wait} s or raise its quota (`flywheel project "
                    f"quota {self.settings.project} --tokens-per-day N`)",
                    wait,
                    code="tokens_per_day_exceeded",
                )
            others = [(second, n) for second, n in self.others_minute if wall - second < 60]
            if rpm is not None and len(self._minute) + sum(n for _, n in others) >= rpm:
                self.used["refused_rpm"] += 1
                self._dirty = True
                oldest = ([wall - (now - self._minute[0])] if self._minute else []) + [second for second, _ in others]
                wait = max(1, math.ceil(60 - (wall - min(oldest)))) if oldest else 60
                raise api.rate_limited(
                    f"project {self.settings.project} sent {rpm} requests in the last minute, "
                    f"its limit; retry after {wait} s",
                    wait,
                )
            self._minute.append(now)
            self.inflight += 1
            self._dirty = True  # the other replicas read this one's minute and flight at its next flush

    def release(self) -> None:
        with self._lock:
            self.inflight -= 1
            self._dirty = True

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
        """This replica's counts written (when they changed, or while requests are in flight), the other
        replicas' read again. The records are made under the lock and written outside it: an admission never
        waits for object storage. A record whose write fails is made again (today's) or kept (a day before's)
        for the next flush."""
        with self._writing:
            with self._lock:
                self._roll()  # a replica with requests in flight but no news rolls at midnight too
                pending, self._unwritten = self._unwritten, {}
                if self._dirty or self.inflight:  # in flight: written again, so the others count it as live
                    pending[self.day] = self._record(self.day, live=True)
                self._dirty, day = False, self.day
            from pipelines.storage import write_json

            failed = {}
            for when, record in pending.items():
                try:
                    write_json(usage_uri(self.settings, when, self.replica), record)
                except Exception as exc:  # noqa: BLE001 (an object store's own errors too): kept for the next flush
                    LOG.warning("usage of %s not written: %s", when, exc)
                    failed[when] = record
            with self._lock:
                for when, record in failed.items():
                    if when == self.day:
                        self._dirty = True  # made again from the counts at the next flush
                    else:  # a day before's: kept, unless the roll left a newer record of it
                        self._unwritten.setdefault(when, record)
        others = self._others()  # file reads outside the lock: requests are admitted meanwhile
        with self._lock:
            if self.day == day:
                self.others, self.others_minute, self.others_inflight = others

    def _record(self, day: str, live: bool = False) -> dict[str, Any]:
        """The usage file's record of `day` now (under the lock): the counts, and with `live` what the other
        replicas add to their own minute and flight."""
        record: dict[str, Any] = {**self.used, "day": day, "project": self.settings.project, "replica": self.replica}
        if live:
            now, wall = time.monotonic(), time.time()
            per_second: dict[int, int] = {}
            for t in self._minute:
                if now - t < 60:  # rounded up: a request never leaves the others' minute before its time
                    second = math.ceil(wall - (now - t))
                    per_second[second] = per_second.get(second, 0) + 1
            record.update(at=wall, live_s=self.live_s, inflight=self.inflight, minute=sorted(per_second.items()))
        return record
