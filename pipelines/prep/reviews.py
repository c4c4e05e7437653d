"""The review queue: down-rated answers wait for a person, whose correction becomes a `human` label.

A turn rated down (`/v1/feedback`, or in the logs) never trains (`prep.labels`); after prep it is in the
clean logs, `held` as "rated down". `flywheel labels review` lists those nobody has decided yet;
`flywheel labels accept ID --call '{"name": ..., "arguments": {...}}'` writes a corrected copy of the raw
record (the same request, the person's call, `label_source: human`, a new record id) into the raw partition
of the day the decision is made, which the next run prepares and trains on (`late.py`); `flywheel labels
reject ID` only records the decision. Decisions are one JSON file per record under `<raw zone>/_reviews/` (no
appends: object storage works the same), written atomically; a record decided once is not listed again.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC
from typing import Any

import orjson

from pipelines.config import Settings
from pipelines.errors import DataProblem
from pipelines.storage import exists, glob, read_bytes, read_json, write_bytes, write_json

REVIEWS_DIR = "_reviews"
DOWN = "rated down"


class ReviewError(DataProblem):
    """A review that cannot be applied (unknown record, a call its tools do not allow); one line."""


def _digest(record_id: str) -> str:
    return hashlib.sha256(record_id.encode()).hexdigest()[:20]


def _decision_uri(settings: Settings, record_id: str) -> str:
    return f"{settings.zone('raw').rstrip('/')}/{REVIEWS_DIR}/{_digest(record_id)}.json"


def queue(settings: Settings) -> list[dict[str, Any]]:
    """The down-rated turns nobody has decided yet, oldest first (what a reviewer needs to judge them)."""
    import pandas as pd

    from pipelines.prep.pipeline import zone_paths

    files = glob(f"{zone_paths(settings)['clean_logs']}/dt=*/*.parquet")
    if not files:
        return []
    frames = []
    for f in files:
        part = pd.read_parquet(f)
        part["dt"] = f.split("dt=", 1)[1].split("/", 1)[0]
        frames.append(part)
    logs = pd.concat(frames, ignore_index=True)
    if "held" not in logs.columns:
        return []
    down = logs[logs["held"].fillna("").str.startswith(DOWN)].sort_values(["event_timestamp", "record_id"])
    out = []
    for row in down.to_dict("records"):
        if exists(_decision_uri(settings, row["record_id"])):
            continue
        out.append(
            {
                "record_id": row["record_id"],
                "dt": row["dt"],
                "request": row["request_text"],
                "tool": row["tool"],
                "arguments": row["arguments_json"],
                "label_source": row["label_source"],
                "at": str(row["event_timestamp"]),
            }
        )
    return out


def _raw_record(settings: Settings, record_id: str, dt: str) -> dict[str, Any]:
    import gzip

    for uri in sorted(glob(f"{settings.zone('raw').rstrip('/')}/dt={dt}/*.jsonl*")):
        data = read_bytes(uri)
        if uri.endswith(".gz"):
            try:
                data = gzip.decompress(data)
            except (OSError, EOFError):
                continue  # prep lists an unreadable file in its manifest; nothing to find in it
        if record_id.encode() not in data:
            continue
        for line in data.splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict) and record.get("record_id") == record_id:
                return record
    raise ReviewError(f"record {record_id} is not in the raw zone's dt={dt} files")


def decide(
    settings: Settings, record_id: str, accept: bool, call: dict[str, Any] | None = None, reviewer: str = "reviewer"
) -> dict[str, Any]:
    """Accept (with the corrected `call`) or reject one queued turn; returns what was written. One reviewer at
    a time per record (a lock): an accept and a reject of the same record never both land."""
    from pipelines.locks import shared_lock

    with shared_lock(_decision_uri(settings, record_id), 60, f"the review of {record_id}", settings.state_lock_uri):
        return _decide(settings, record_id, accept, call, reviewer)


def _decide(
    settings: Settings, record_id: str, accept: bool, call: dict[str, Any] | None, reviewer: str
) -> dict[str, Any]:
    from datetime import datetime

    from pipelines.logs.tools import argument_errors
    from pipelines.logs.toolsets import registered_catalogue

    waiting = {r["record_id"]: r for r in queue(settings)}
    if record_id not in waiting:
        decided = exists(_decision_uri(settings, record_id))
        raise ReviewError(f"record {record_id} is {'already decided' if decided else 'not in the review queue'}")
    entry = waiting[record_id]
    decision: dict[str, Any] = {
        "record_id": record_id,
        "accepted": accept,
        "reviewer": reviewer,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if accept:
        if not isinstance(call, dict) or "name" not in call:
            raise ReviewError('accepting needs the corrected call: --call \'{"name": ..., "arguments": {...}}\'')
        record = _raw_record(settings, record_id, entry["dt"])
        offered = {t["function"]["name"] for t in record["request"]["tools"]}
        name, arguments = call.get("name"), call.get("arguments") or {}
        if name is not None:
            if name not in offered:
                raise ReviewError(f"{name} is not one of the tools this turn offered ({', '.join(sorted(offered))})")
            errors = argument_errors(name, arguments, registered_catalogue(settings.zone("raw")))
            if errors:
                raise ReviewError(f"the corrected {name} call breaks its schema: {errors[0]}")
        fixed_id = f"{record_id}-review"
        message = (
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{fixed_id}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments, separators=(",", ":"))},
                    }
                ],
            }
            if name is not None
            else {"role": "assistant", "content": ""}
        )
        corrected = {
            **record,
            "record_id": fixed_id,
            "label_source": "human",
            "feedback": "none",
            "response": {
                **record["response"],
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if name else "stop"}],
            },
        }
        # into the partition of the day it is made: the next run (it prepares that day) trains on it, whatever
        # day the turn itself was logged on
        today = datetime.now(UTC).date().isoformat()
        target = f"{settings.zone('raw').rstrip('/')}/dt={today}/reviews-{_digest(record_id)}.jsonl"
        write_bytes(target, orjson.dumps(corrected) + b"\n")
        decision.update(corrected_record=fixed_id, file=target)
    write_json(_decision_uri(settings, record_id), decision)
    return decision


def decisions(settings: Settings) -> list[dict[str, Any]]:
    return [read_json(u) for u in sorted(glob(f"{settings.zone('raw').rstrip('/')}/{REVIEWS_DIR}/*.json"))]
