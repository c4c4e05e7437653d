"""Labels that arrive after their turn's day was prepared: a rating sent days later (`/v1/feedback`) or a person's
correction (`flywheel labels accept`) reaches the next training run, not only a re-run of the turn's old day.

A correction is written into the raw partition of the day it was made (`reviews.py`), so the run that prepares
that day trains on it. A rating is kept where it arrives (`<raw zone>/_feedback/dt=<day it was sent>/`); when a
window is prepared, every turn rated during the window but logged on an earlier day (up to
`quality.late_label_days` back) is copied, as it was logged, into one file of the window's last day
(`late-ratings-<window>.jsonl`, rewritten by each prep of the window: idempotent). Prep then applies the latest
rating to it like to any turn: a late thumbs-up lets a champion answer train, a late thumbs-down holds it out of
training and puts it in the review queue.
"""

from __future__ import annotations

from datetime import timedelta

import orjson

from pipelines.config import Settings
from pipelines.logs.feedback import RATINGS, feedback_zone
from pipelines.storage import glob, read_bytes, remove, write_bytes
from pipelines.window import DateWindow

LATE_PREFIX = "late-ratings-"


def rated_during(raw_zone: str, window: DateWindow) -> set[str]:
    """The record ids rated on the window's days (by the day the rating was sent)."""
    ids: set[str] = set()
    for day in window.days():
        for uri in glob(f"{feedback_zone(raw_zone)}/dt={day.isoformat()}/*.jsonl"):
            for line in read_bytes(uri).splitlines():
                try:
                    event = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a torn last line
                if (
                    isinstance(event, dict)
                    and event.get("rating") in RATINGS
                    and isinstance(event.get("record_id"), str)
                ):
                    ids.add(event["record_id"])
    return ids


def _lines_of(uri: str) -> list[bytes]:
    import gzip

    data = read_bytes(uri)
    if uri.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError):
            return []  # prep reports an unreadable file where its own day is prepared
    return data.splitlines()


def find_turns(raw_zone: str, ids: set[str], days: list[str]) -> dict[str, bytes]:
    """The logged line of each of `ids` found in the raw partitions of `days` (the late copies not searched)."""
    found: dict[str, bytes] = {}
    for day in days:
        for uri in sorted(glob(f"{raw_zone.rstrip('/')}/dt={day}/*.jsonl*")):
            if uri.rsplit("/", 1)[-1].startswith(LATE_PREFIX):
                continue
            for line in _lines_of(uri):
                if not any(i.encode() in line for i in ids - set(found)):
                    continue
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(record, dict) and record.get("record_id") in ids:
                    found.setdefault(str(record["record_id"]), line)
    return found


def stage_late_ratings(settings: Settings, window: DateWindow) -> str | None:
    """Copy the turns rated during `window` but logged before it into the window's last day (one file, replaced
    on each run); returns its URI, or None (and no file) when there are none."""
    raw = settings.zone("raw").rstrip("/")
    target = f"{raw}/dt={window.end.isoformat()}/{LATE_PREFIX}{window.label}.jsonl"
    ids = rated_during(raw, window)
    earlier = [(window.start - timedelta(days=n)).isoformat() for n in range(1, settings.quality.late_label_days + 1)]
    turns = find_turns(raw, ids, earlier) if ids else {}
    if not turns:
        remove(target)  # a re-run whose late ratings went away leaves no stale copy
        return None
    write_bytes(target, b"".join(turns[i] + b"\n" for i in sorted(turns)))
    return target
