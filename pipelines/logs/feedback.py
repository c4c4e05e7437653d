"""Ratings that arrive after a turn was logged (the gateway's `POST /v1/feedback`): one JSON line per
rating under `<raw zone>/_feedback/dt=<day>/`, next to the immutable raw partitions (which only hold
agent turns). Prep applies the latest rating of each record id to that record's `feedback`."""

from __future__ import annotations

import orjson

FEEDBACK_DIR = "_feedback"
RATINGS = ("up", "down", "none")


def feedback_zone(raw_zone: str) -> str:
    return f"{raw_zone.rstrip('/')}/{FEEDBACK_DIR}"


def read_feedback(raw_zone: str) -> dict[str, str]:
    """record id -> its latest rating; lines that are not a rating (a torn last line) are skipped."""
    from pipelines.storage import glob, read_bytes

    latest: dict[str, tuple[str, str]] = {}
    for uri in sorted(glob(f"{feedback_zone(raw_zone)}/dt=*/*.jsonl")):
        for line in read_bytes(uri).splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not (
                isinstance(event, dict) and event.get("rating") in RATINGS and isinstance(event.get("record_id"), str)
            ):
                continue
            at = str(event.get("timestamp", ""))
            if event["record_id"] not in latest or at >= latest[event["record_id"]][0]:
                latest[event["record_id"]] = (at, event["rating"])
    return {record_id: rating for record_id, (_, rating) in latest.items()}
