"""Zone I/O that works on a local folder and on object storage (fsspec), for small files and listings."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec


def fs_for(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def glob(uri_pattern: str) -> list[str]:
    fs, pattern = fs_for(uri_pattern)
    protocol = uri_pattern.split("://", 1)[0] + "://" if "://" in uri_pattern else ""
    return sorted(protocol + p for p in fs.glob(pattern))


def exists(uri: str) -> bool:
    fs, path = fs_for(uri)
    return bool(fs.exists(path))


def remove(uri: str) -> None:
    fs, path = fs_for(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def move(src: str, dst: str) -> None:
    """Move a file or a folder. Locally a rename; on object storage (no folders, no rename) every key
    under `src` is copied to its place under `dst`, then the sources are deleted (copies first: a
    crash in between leaves both, never neither)."""
    fs, src_path = fs_for(src)
    _, dst_path = fs_for(dst)
    if fs.exists(dst_path):  # a folder moved onto another would nest inside it (or merge on S3)
        raise FileExistsError(f"move: {dst} already exists")
    if is_local(src):
        fs.makedirs(dst_path.rsplit("/", 1)[0], exist_ok=True)
        fs.mv(src_path, dst_path, recursive=True)
        return
    keys = fs.find(src_path)
    if not keys:
        raise FileNotFoundError(src)
    if keys == [src_path]:  # a single object
        fs.copy(src_path, dst_path)
    else:
        for key in keys:
            fs.copy(key, dst_path + key[len(src_path.rstrip("/")) :])
    fs.rm(src_path, recursive=True)


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def lock_file(uri: str) -> str:
    """The local lock file guarding read-modify-writes of `uri`: `<uri>.lock` beside a local file; for
    a file on object storage (which has no locks) a local file under ~/.flywheel/locks named after the
    URI, which serializes this host's writers only: state several hosts change takes `locks.shared_lock` (an
    advisory lock on the cluster's database, this file lock where there is none)."""
    if is_local(uri):
        path = uri.removeprefix("file://") + ".lock"
    else:
        digest = hashlib.sha256(uri.encode()).hexdigest()[:16]
        path = os.path.join(os.path.expanduser("~"), ".flywheel", "locks", f"{digest}.lock")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return path


class Busy(RuntimeError):
    """Another process held a lock longer than the wait allowed (retrying later is the remedy)."""


@contextlib.contextmanager
def locked(uri: str, timeout_s: float, what: str) -> Iterator[None]:
    """Hold the lock of `uri` (see `lock_file`) while the block runs; `Busy` after `timeout_s`."""
    from filelock import FileLock, Timeout

    lock = FileLock(lock_file(uri), timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        raise Busy(
            f"{what} is held by another run (lock {lock.lock_file}) for over {timeout_s:g} s; "
            "retry when it has finished"
        ) from None
    try:
        yield
    finally:
        lock.release()


def write_bytes(uri: str, data: bytes) -> str:
    """Replace a file atomically: readers see the old or the new content, never half of it.

    Locally: a uniquely named temporary file in the same folder (two writers never share one),
    fsynced, renamed over the target, and the folder fsynced (the rename survives a power cut).
    On object storage one PUT is atomic already."""
    if not is_local(uri):
        fs, path = fs_for(uri)
        fs.pipe_file(path, data)
        return uri
    path = uri.removeprefix("file://")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return uri


def write_text(uri: str, text: str) -> str:
    """Write text atomically (see `write_bytes`)."""
    return write_bytes(uri, text.encode("utf-8"))


def create_secret_once(path: str, text: str) -> str:
    """A local secret file (0600) created whole or not at all: `text` goes in only when no non-empty file is there
    (two first starts racing: the first one's file wins and both read it). Returns the file's contents."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        with open(path) as f:
            found = f.read().strip()
        if found:
            return found
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")  # 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # fails when another process created it meanwhile: its file wins
        except FileExistsError:
            with open(path) as f:
                if not f.read().strip():  # an empty one (an older crash between create and write): replaced
                    os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    with open(path) as f:
        return f.read().strip()


def write_json(uri: str, data: Any) -> str:
    return write_text(uri, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(uri: str) -> Any:
    return json.loads(read_bytes(uri))


def window_partitions(table_uri: str, days: list[str]) -> list[str]:
    """A table's partition folders for these dates, flat (`dt=D`) or under a split (`split=S/dt=D`)."""
    return [p for d in days for p in glob(f"{table_uri}/dt={d}") + glob(f"{table_uri}/split=*/dt={d}")]


def read_bytes(uri: str) -> bytes:
    """The whole file in one read: on object storage one GET, so an object replaced concurrently is read
    as the old or the new version, never fails half-way (an open + ranged reads checks the ETag)."""
    fs, path = fs_for(uri)
    return fs.cat_file(path)


def makedirs(uri: str) -> None:
    fs, path = fs_for(uri)
    fs.makedirs(path, exist_ok=True)
