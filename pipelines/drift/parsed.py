"""The hourly drift check reads only what is new: each raw file's parse (the columns the summary needs, the
quarantine reasons, the line count) is kept once, keyed by the file's content hash and the catalogue it was parsed
against, and a check merges the kept parses of its window's files; only a file that arrived (or changed) since the
last check is parsed.

Where: `<reports zone>/drift/parsed/<key>.parquet` (+ `.json`). The content hash of a file is computed once and
remembered with the file's size and modification stamp (an object's ETag on object storage): a file whose stamp
moved is hashed again, and a changed file gets a new key (its old parse is no longer read); `prune` removes the
parses no raw file of the zone has any more (a removed file takes its parse with it).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import pandas as pd

from pipelines.config import Settings
from pipelines.storage import exists, fs_for, glob, read_bytes, read_json, remove, write_bytes, write_json

VERSION = "2"  # bumped when what a parse keeps changes (2: a canary's teacher copies left out)
COLUMNS = (
    "tool",
    "workload_id",
    "country",
    "currency",
    "channel",
    "category",
    "request_text",
    "latency_ms",
    "amount",
    "feedback",
)  # what `signals.summarize` reads of a clean row


def folder(settings: Settings) -> str:
    return f"{settings.zone('reports')}/drift/parsed"


def catalogue_digest(tools: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(tools, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _stamp(uri: str) -> str:
    """What changes when a file changes, cheaply: size and modification time (an object's ETag)."""
    fs, path = fs_for(uri)
    info = fs.info(path)
    return json.dumps([info.get("size"), info.get("mtime") or info.get("LastModified"), info.get("ETag")], default=str)


class ParseCache:
    """The kept parses of one zone, and the stamp -> content hash index that spares re-hashing a file."""

    def __init__(self, settings: Settings, tools: dict[str, dict[str, Any]]) -> None:
        self.folder = folder(settings)
        self.catalogue = catalogue_digest(tools)
        self.index_uri = f"{self.folder}/index.json"
        try:
            self.index: dict[str, dict[str, str]] = read_json(self.index_uri)
        except (FileNotFoundError, ValueError):
            self.index = {}
        self.changed = False

    def key(self, uri: str) -> str:
        """The file's parse key: its content hash (from the index while its stamp holds), the catalogue, VERSION."""
        stamp = _stamp(uri)
        known = self.index.get(uri)
        if known is None or known.get("stamp") != stamp:
            known = {"stamp": stamp, "sha256": hashlib.sha256(read_bytes(uri)).hexdigest()}
            self.index[uri] = known
            self.changed = True
        return f"{known['sha256'][:32]}-{self.catalogue}-v{VERSION}"

    def load(self, key: str) -> tuple[pd.DataFrame, Counter[str], int] | None:
        parquet, meta = f"{self.folder}/{key}.parquet", f"{self.folder}/{key}.json"
        if not (exists(parquet) and exists(meta)):
            return None
        import io

        try:
            info = read_json(meta)
            frame = pd.read_parquet(io.BytesIO(read_bytes(parquet)))
        except (FileNotFoundError, ValueError):  # pruned (or torn) by another check meanwhile: parsed again
            return None
        return frame, Counter(info["reasons"]), int(info["lines"])

    def store(self, key: str, rows: list[dict[str, Any]], reasons: Counter[str], lines: int) -> pd.DataFrame:
        import io

        frame = pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows], columns=list(COLUMNS))
        buffer = io.BytesIO()
        frame.to_parquet(buffer, index=False)
        write_bytes(f"{self.folder}/{key}.parquet", buffer.getvalue())
        write_json(f"{self.folder}/{key}.json", {"reasons": dict(reasons), "lines": lines})
        return frame

    def save_index(self, present: list[str]) -> None:
        """The index of the files that exist (a removed file's entry goes); written only when it changed."""
        kept = {uri: v for uri, v in self.index.items() if uri in set(present) or exists(uri)}
        if kept != self.index or self.changed:
            self.index = kept
            write_json(self.index_uri, kept)

    def prune(self) -> int:
        """Remove the parses no raw file the index knows has any more (a removed file's too); returns how many."""
        wanted = {f"{v['sha256'][:32]}-{self.catalogue}-v{VERSION}" for u, v in self.index.items() if exists(u)}
        gone = 0
        for uri in glob(f"{self.folder}/*.parquet"):
            key = uri.rsplit("/", 1)[-1].removesuffix(".parquet")
            if key not in wanted:
                remove(uri)
                remove(f"{self.folder}/{key}.json")
                gone += 1
        return gone
