"""Served turns written back as log records: the flywheel's next training data (`capture_record` makes the
record, `CaptureWriter` keeps it).

One writer per gateway process appends JSON lines to `raw/dt=<day>/gateway-<start>-<pid>-<token>-<n>.jsonl`
(`token`: random, the writer's own: in a pod every gateway is PID 1, and two replicas started in the same second
would otherwise upload under one name, so concurrent gateways never share a file). Requests of one process
append under a thread lock, and every record is flushed and fsynced before its request is answered:
an acknowledged record survives a kill of the gateway; a kill mid-write leaves at most one torn last
line, which prep quarantines as `bad_json` (never silently lost). A file is closed at the next day, past
`capture_rotate_bytes`, or once it is `max_age_s` old (`rotate_old`, called by the gateway's flusher).

With the raw zone on object storage (no appends there), records go to a local spool folder of the process's own with
the same layout and each closed file is uploaded whole, so an acknowledged turn reaches object storage within about
`max_age_s`. A closed file whose upload fails stays in the spool and is tried again at each rotation and each
flusher pass (`rotate_old`) and at close, never failing the request that rotated it. The writer holds an exclusive
lock on its spool folder for as long as it runs: a folder whose lock can be taken belongs to a writer that is gone
(a process id says nothing in a container, where every gateway is PID 1), and its files are uploaded when the next
writer starts. Once closed, a writer refuses more records (`WriterClosed`): a deleted project's request in flight
never recreates its folders.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import orjson

from pipelines import storage
from pipelines.logs.schema import ANONYMOUS
from pipelines.logs.tools import TOOL_WORKLOAD, WORKLOAD_TOOLS, WORKLOADS

if TYPE_CHECKING:
    from pipelines.gateway.openai_api import ChatCompletionRequest, Served

LOG = logging.getLogger("flywheel.gateway")


class WriterClosed(RuntimeError):
    """The writer was closed (its gateway is stopping, or its project was deleted): nothing more is written."""


@dataclass
class _Open:
    path: Path
    handle: IO[bytes]
    size: int
    opened: float  # time.monotonic() when it was opened


class CaptureWriter:
    def __init__(self, raw_zone: str, rotate_bytes: int, spool: Path | None = None, max_age_s: float | None = None):
        self.raw_zone = raw_zone.rstrip("/")
        self.remote = not storage.is_local(raw_zone)
        if self.remote and spool is None:
            raise ValueError(f"{raw_zone} is on object storage: a local spool folder is needed")
        self._stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.spool = Path(spool) if spool else None
        self.rotate_bytes = rotate_bytes
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}  # day -> its current file (two days at most: around midnight)
        self._n = 0
        self._closed = False
        self._held: int | None = None  # the spool folder's lock, held while this writer runs
        self._token = os.urandom(4).hex()  # in every file name: no other writer's, whatever its pid and start
        self._pending: list[Path] = []  # closed files whose upload failed: tried again (`_retry`)
        if self.remote and self.spool:
            # on object storage: a spool folder of this writer's own (another gateway's files are never touched)
            self.folder = self.spool / f"{self._stamp}-{os.getpid()}-{self._token}"
            self._held = _hold(self.folder)
            self.upload_spool()
        else:
            self.folder = Path(raw_zone.removeprefix("file://"))

    def write(self, record: dict[str, Any]) -> str:
        """Append one record durably (flushed and fsynced before this returns); returns its file."""
        line = orjson.dumps(record) + b"\n"
        day = str(record["timestamp"])[:10]
        with self._lock:
            if self._closed:
                raise WriterClosed(f"the writer of {self.raw_zone} is closed")
            current = self._open.get(day)
            if current is None or current.size + len(line) > self.rotate_bytes:
                current = self._rotate(day)
            current.handle.write(line)
            current.handle.flush()
            os.fsync(current.handle.fileno())
            current.size += len(line)
            return str(current.path)

    def _rotate(self, day: str) -> _Open:
        self._close(day)
        for older in sorted(self._open)[:-1]:  # a day two days back gets no more turns
            self._close(older)
        self._n += 1
        folder = self.folder / f"dt={day}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"gateway-{self._stamp}-{os.getpid()}-{self._token}-{self._n:04d}.jsonl"
        handle = open(path, "ab")  # noqa: SIM115 (kept open across requests; closed on rotation and close)
        dir_fd = os.open(folder, os.O_RDONLY)  # the new file's name survives a power cut
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._open[day] = _Open(path, handle, path.stat().st_size, time.monotonic())
        return self._open[day]

    def rotate_old(self) -> int:
        """Close (and, on object storage, upload) every open file older than `max_age_s`: an acknowledged turn
        reaches the raw zone within about that long. Returns how many files were closed."""
        with self._lock:
            self._retry()
            if self.max_age_s is None:
                return 0
            old = [day for day, f in self._open.items() if time.monotonic() - f.opened >= self.max_age_s]
            for day in old:
                self._close(day)
            return len(old)

    def _close(self, day: str) -> None:
        current = self._open.pop(day, None)
        if current is None:
            return
        current.handle.close()
        if self.remote:
            self._pending.append(current.path)
            self._retry()

    def _retry(self) -> list[str]:
        """Upload the closed files still in the spool (an upload that failed stays there, tried again by the next
        rotation, flusher pass or close); returns the failures, never raises."""
        failures = []
        for path in list(self._pending):
            try:
                self._upload(path)
                self._pending.remove(path)
            except Exception as exc:  # noqa: BLE001 (the zone unreachable: kept in the spool, tried again)
                failures.append(f"{path.parent.name}/{path.name}: {type(exc).__name__}: {exc}")
                LOG.warning("capture file %s not uploaded yet (%s); kept in the spool", path, exc)
        return failures

    def _upload(self, path: Path) -> None:
        storage.write_bytes(f"{self.raw_zone}/{path.parent.name}/{path.name}", path.read_bytes())
        path.unlink()

    def upload_spool(self) -> int:
        """Upload the files that writers no longer running left in the spool (each writer spools into a folder of
        its own, locked while it runs); returns how many. A failed upload is logged and left for the next start."""
        done = 0
        if self.spool is None:
            raise RuntimeError("the capture writer has no spool")
        for folder in sorted(p for p in self.spool.glob("*-*") if p.is_dir()):
            if folder == self.folder:
                continue
            held = _try_hold(folder)
            if held is None:
                continue  # a live writer's (another gateway process beside this one)
            try:
                done += self._upload_folder(folder)
            finally:
                os.close(held)
        return done

    def _upload_folder(self, folder: Path) -> int:
        done = 0
        for path in sorted(folder.glob("dt=*/gateway-*.jsonl")):
            try:
                self._upload(path)
                done += 1
            except Exception as exc:  # noqa: BLE001 (the zone unreachable: kept for the next start)
                LOG.warning("spooled %s not uploaded yet (%s: %s)", path, type(exc).__name__, exc)
        if not any(folder.glob("dt=*/gateway-*.jsonl")):
            for part in sorted(folder.glob("dt=*")):
                part.rmdir()
            (folder / LOCK).unlink(missing_ok=True)
            folder.rmdir()
        return done

    def close(self) -> list[str]:
        """Close every open file (uploading it, on object storage), each tried even when one fails; no record is
        taken after this. Returns the failures (each file that did not upload stays in the spool for the next
        start)."""
        failures: list[str] = []
        with self._lock:
            self._closed = True
            for day in list(self._open):
                try:
                    self._close(day)
                except Exception as exc:  # noqa: BLE001 (left in the spool; the next writer uploads it)
                    failures.append(f"{day}: {type(exc).__name__}: {exc}")
                    LOG.warning("capture file of %s not closed (%s); kept in the spool", day, exc)
            failures += self._retry()
        if self._held is not None:
            os.close(self._held)
            self._held = None
        return failures


LOCK = ".writer.lock"


def _hold(folder: Path) -> int:
    """Create `folder` and take its writer lock (exclusive, held until the fd is closed or the process dies)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def _try_hold(folder: Path) -> int | None:
    """The writer lock of another writer's folder when that writer is gone, else None (it still runs)."""
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def expire(zone: str, days: int, today: str | None = None) -> list[str]:
    """Delete the `dt=<day>` partitions of `zone` older than `days` (the gateway's own stores at rest, never the
    raw zone); returns what was deleted."""
    from datetime import date, timedelta

    from pipelines.storage import glob, remove

    cutoff = (date.fromisoformat(today) if today else date.today()) - timedelta(days=days)
    gone = []
    for part in glob(f"{zone.rstrip('/')}/dt=*"):
        day = part.rstrip("/").rsplit("dt=", 1)[-1]
        try:
            old = date.fromisoformat(day) < cutoff
        except ValueError:
            continue
        if old:
            remove(part)
            gone.append(part)
    return gone


def workload_of(specs: list[dict[str, Any]], called: str | None, hint: str | None) -> str:
    """The agent node a served turn belongs to: the caller's `metadata.workload_id` when it is one of
    ours, else the node whose tool set overlaps the offered tools most (ties: the called tool's node)."""
    if hint in WORKLOADS:
        return hint
    names = {s["function"]["name"] for s in specs}
    preferred = TOOL_WORKLOAD.get(called or "")
    return max(WORKLOADS, key=lambda w: (len(names & set(WORKLOAD_TOOLS[w])), w == preferred))


def capture_record(
    request: ChatCompletionRequest,
    served: Served,
    body: dict[str, Any],
    *,
    latency_ms: float,
    defaults: dict[str, str],
    served_by: str | None = None,
) -> dict[str, Any]:
    """The served turn as one record of our log schema (`pipelines.logs.schema.AgentTurn`): the request as
    the caller sent it (prep redacts it on its way to training), the answer it got, the model, tokens,
    latency and the customer fields; `model` is the model that answered (`served_by`: a Triton model, or
    `teacher:<name>` in shadow), else the name asked for (`metadata` may carry session_id, workload_id, country,
    currency,
    channel; the rest come from the gateway's settings)."""
    meta = request.metadata or {}
    message = body["choices"][0]["message"]
    called = (message.get("tool_calls") or [{}])[0].get("function", {}).get("name")
    user_turns = sum(1 for m in request.messages if m.role == "user")
    request_json = {
        "messages": served.messages,
        "tools": served.specs or [t.model_dump(exclude_none=True) for t in request.tools or []],
    }
    return {
        "record_id": served.response_id,
        "timestamp": served.row["event_time"],
        "session_id": meta.get("session_id") or served.response_id,
        "turn_index": max(0, user_turns - 1),
        "customer_id": request.user or ANONYMOUS,
        "workload_id": workload_of(served.specs, called, meta.get("workload_id")),
        "model": served_by or body["model"],
        "request": request_json,
        "response": {
            "id": served.response_id,
            "choices": [{"index": 0, "message": message, "finish_reason": body["choices"][0]["finish_reason"]}],
        },
        "latency_ms": round(latency_ms, 3),
        "retrieval_latency_ms": 0.0,
        "prompt_tokens": body["usage"]["prompt_tokens"],
        "completion_tokens": body["usage"]["completion_tokens"],
        "country": meta.get("country") or defaults["country"],
        "currency": meta.get("currency") or defaults["currency"],
        "channel": meta.get("channel") or defaults["channel"],
        "feedback": "none",
        # the teacher's answer (shadow) is a label; our own model's is not, until a person confirms it
        "label_source": "teacher" if str(served_by or "").startswith("teacher:") else "champion",
    }
