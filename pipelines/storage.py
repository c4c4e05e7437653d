"""Zone I/O that works on a local folder and on object storage (fsspec), for small files and listings."""

from __future__ import annotations

import json
from typing import Any

import fsspec


def fs_for(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(uri)
    return fs, path


def glob(uri_pattern: str) -> list[str]:
    fs, pattern = fs_for(uri_pattern)
    protocol = uri_pattern.split("://", 1)[0] + "://" if "://" in uri_pattern else ""
    return sorted(protocol + p for p in fs.glob(pattern))


def remove(uri: str) -> None:
    fs, path = fs_for(uri)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def move(src: str, dst: str) -> None:
    fs, src_path = fs_for(src)
    _, dst_path = fs_for(dst)
    fs.makedirs(dst_path.rsplit("/", 1)[0], exist_ok=True)
    fs.mv(src_path, dst_path, recursive=True)


def write_text(uri: str, text: str) -> str:
    """Write through a temporary file and a rename, so readers never see half a file."""
    fs, path = fs_for(uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{path}.tmp"
    with fs.open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    fs.mv(tmp, path)
    return uri


def write_json(uri: str, data: Any) -> str:
    return write_text(uri, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(uri: str) -> Any:
    fs, path = fs_for(uri)
    with fs.open(path, "r") as fh:
        return json.load(fh)


def window_partitions(table_uri: str, days: list[str]) -> list[str]:
    """A table's partition folders for these dates, flat (`dt=D`) or under a split (`split=S/dt=D`)."""
    return [p for d in days for p in glob(f"{table_uri}/dt={d}") + glob(f"{table_uri}/split=*/dt={d}")]


def read_bytes(uri: str) -> bytes:
    fs, path = fs_for(uri)
    with fs.open(path, "rb") as fh:
        return fh.read()


def makedirs(uri: str) -> None:
    fs, path = fs_for(uri)
    fs.makedirs(path, exist_ok=True)
