"""Served turns written back as log records: the flywheel's next training data.

One writer per gateway process appends JSON lines to `raw/dt=<day>/gateway-<start>-<pid>-<n>.jsonl`
(a name no other process uses, so concurrent gateways never share a file). Requests of one process
append under a thread lock, and every record is flushed and fsynced before its request is answered:
an acknowledged record survives a kill of the gateway; a kill mid-write leaves at most one torn last
line, which prep quarantines as `bad_json` (never silently lost). A file is closed at the next day or
past `capture_rotate_bytes`. With the raw zone on object storage (no appends there), records go to
a local spool of the process's own with the same layout and each closed file is uploaded whole; files
left in the spool by a gateway no longer running are uploaded when the next one starts.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from pipelines import storage

LOG = logging.getLogger("flywheel.gateway")


@dataclass
class _Open:
    path: Path
    handle: IO[bytes]
    size: int


class CaptureWriter:
    def __init__(self, raw_zone: str, rotate_bytes: int, spool: Path | None = None):
        self.raw_zone = raw_zone.rstrip("/")
        self.remote = not storage.is_local(raw_zone)
        if self.remote and spool is None:
            raise ValueError(f"{raw_zone} is on object storage: a local spool folder is needed")
        self._stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.spool = Path(spool) if spool else None
        # on object storage: a spool folder of this process's own (another gateway's files are never touched)
        self.folder = (
            self.spool / f"{self._stamp}-{os.getpid()}"
            if self.remote and self.spool
            else Path(raw_zone.removeprefix("file://"))
        )
        self.rotate_bytes = rotate_bytes
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}  # day -> its current file (two days at most: around midnight)
        self._n = 0
        if self.remote:
            self.upload_spool()

    def write(self, record: dict[str, Any]) -> str:
        """Append one record durably (flushed and fsynced before this returns); returns its file."""
        line = orjson.dumps(record) + b"\n"
        day = str(record["timestamp"])[:10]
        with self._lock:
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
        path = folder / f"gateway-{self._stamp}-{os.getpid()}-{self._n:04d}.jsonl"
        handle = open(path, "ab")  # noqa: SIM115 (kept open across requests; closed on rotation and close)
        dir_fd = os.open(folder, os.O_RDONLY)  # the new file's name survives a power cut
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._open[day] = _Open(path, handle, path.stat().st_size)
        return self._open[day]

    def _close(self, day: str) -> None:
        current = self._open.pop(day, None)
        if current is None:
            return
        current.handle.close()
        if self.remote:
            self._upload(current.path)

    def _upload(self, path: Path) -> None:
        storage.write_bytes(f"{self.raw_zone}/{path.parent.name}/{path.name}", path.read_bytes())
        path.unlink()

    def upload_spool(self) -> int:
        """Upload the files that gateways no longer running left in the spool (each process spools into
        `<start>-<pid>/`); returns how many. A failed upload is logged and left for the next start."""
        import psutil

        done = 0
        if self.spool is None:
            raise RuntimeError("the capture writer has no spool")
        for folder in sorted(self.spool.glob("*-*")):
            pid = folder.name.rsplit("-", 1)[-1]
            if folder == self.folder or not pid.isdigit() or psutil.pid_exists(int(pid)):
                continue
            for path in sorted(folder.glob("dt=*/gateway-*.jsonl")):
                try:
                    self._upload(path)
                    done += 1
                except Exception as exc:  # noqa: BLE001 (the zone unreachable: kept for the next start)
                    LOG.warning("spooled %s not uploaded yet (%s: %s)", path, type(exc).__name__, exc)
        return done

    def close(self) -> None:
        with self._lock:
            for day in list(self._open):
                self._close(day)


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
