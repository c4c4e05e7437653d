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

from pipelines.clients.teacher import TeacherClient
from pipelines.config import Settings
from pipelines.errors import DataProblem
from pipelines.logs.schema import TEACHER_COPY_SUFFIX, teacher_call
from pipelines.storage import exists, glob, read_bytes, read_json, write_bytes, write_json

REVIEWS_DIR = "_reviews"
DOWN = "rated down"


class ReviewError(DataProblem):
    """A review that cannot be applied (unknown record, a call its tools do not allow); one line. `kind` names
    the case for a caller that tells them apart (`relabel`): decided, unoffered_tool, schema, or other."""

    def __init__(self, message: str, kind: str = "other") -> None:
        super().__init__(message)
        self.kind = kind


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
    ids = logs["record_id"].astype(str)
    copies = set(ids[ids.str.endswith(TEACHER_COPY_SUFFIX)])  # turns a canary's teacher answered too
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
                "teacher_copy": f"{row['record_id']}{TEACHER_COPY_SUFFIX}" in copies,
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
    settings: Settings,
    record_id: str,
    accept: bool,
    call: dict[str, Any] | None = None,
    reviewer: str = "reviewer",
    label_source: str = "human",
    entry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Accept (with the corrected `call`) or reject one queued turn; returns what was written. One reviewer at
    a time per record (a lock): an accept and a reject of the same record never both land. `label_source`: who
    wrote the corrected call (`human`; `teacher` when `relabel` asked the teacher); `entry`: the turn's queue
    entry when the caller read the queue already (`relabel`: one scan of the clean logs for the whole run)."""
    from pipelines.locks import shared_lock

    with shared_lock(_decision_uri(settings, record_id), 60, f"the review of {record_id}", settings.state_lock_uri):
        return _decide(settings, record_id, accept, call, reviewer, label_source, entry)


def _decide(
    settings: Settings,
    record_id: str,
    accept: bool,
    call: dict[str, Any] | None,
    reviewer: str,
    label_source: str = "human",
    entry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from datetime import datetime

    from pipelines.logs.tools import argument_errors
    from pipelines.logs.toolsets import registered_catalogue

    if exists(_decision_uri(settings, record_id)):  # under the record's lock: an accept and a reject never both land
        raise ReviewError(f"record {record_id} is already decided", "decided")
    if entry is not None:  # the caller's scan of the queue, checked against the turn's row as it is now
        waiting = {record_id: entry} if _still_down(settings, entry) else {}
    else:
        waiting = {r["record_id"]: r for r in queue(settings)}
    if record_id not in waiting:
        raise ReviewError(f"record {record_id} is not in the review queue")
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
                raise ReviewError(
                    f"{name} is not one of the tools this turn offered ({', '.join(sorted(offered))})", "unoffered_tool"
                )
            errors = argument_errors(name, arguments, registered_catalogue(settings.zone("raw")))
            if errors:
                raise ReviewError(f"the corrected {name} call breaks its schema: {errors[0]}", "schema")
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
            "label_source": label_source,
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
        decision.update(corrected_record=fixed_id, file=target, label_source=label_source)
    write_json(_decision_uri(settings, record_id), decision)
    return decision


def _still_down(settings: Settings, entry: dict[str, Any]) -> bool:
    """Whether a queued turn is still held as rated down in its day's clean logs."""
    import pandas as pd

    from pipelines.prep.pipeline import zone_paths

    for f in glob(f"{zone_paths(settings)['clean_logs']}/dt={entry['dt']}/*.parquet"):
        rows = pd.read_parquet(f, columns=["record_id", "held"], filters=[("record_id", "==", entry["record_id"])])
        if len(rows):
            return str(rows["held"].iloc[0] or "").startswith(DOWN)
    return False


def decisions(settings: Settings) -> list[dict[str, Any]]:
    return [read_json(u) for u in sorted(glob(f"{settings.zone('raw').rstrip('/')}/{REVIEWS_DIR}/*.json"))]


def relabel(settings: Settings, client: TeacherClient, limit: int) -> dict[str, Any]:
    """The teacher answers again up to `limit` queued turns our own model answered (label source `champion`),
    oldest first: its call, if one of the turn's tools and valid for its schema, is accepted as a `teacher`
    label (`<id>-review`, as a person's correction is written), and the pair builder makes it the chosen side
    over the down-rated answer (source `relabel`). A turn the teacher answers with no call, with a call that
    fails the checks, or with the very answer that was rated down, or whose request it refuses (HTTP 400, 413,
    422), stays in the queue for a person, counted by reason, and is not asked again (a marker under
    `_reviews/_relabel/`). A refusal is marked only once the teacher has answered another request of the run: a
    teacher that refuses the first `REFUSALS_IN_A_ROW` and answers none is misconfigured, and the run stops with
    nothing marked. Any other failure of the teacher stops the run (`TeacherError`: one line) and is counted
    against the turn it was asked; a turn it failed on `MAX_FAILURES` times is left for a person. What was
    decided before a stop stays decided. Refused when `teacher` labels do not train
    (`quality.train_label_sources`): a relabel would only take the turn from a person's queue."""
    from collections import Counter

    from pipelines.clients.teacher import TeacherError

    if "teacher" not in settings.quality.train_label_sources:
        raise ReviewError(
            "relabel: teacher labels do not train here (quality.train_label_sources): a relabel would only take "
            "the turns from a person's queue"
        )
    ours = [r for r in queue(settings) if r["label_source"] == "champion"]
    waiting = [r for r in ours if "reason" not in _tried(settings, r["record_id"])][:limit]
    relabelled: list[dict[str, Any]] = []
    left: Counter[str] = Counter()
    refused: list[tuple[dict[str, Any], str]] = []
    answered = False
    for entry in waiting:
        try:
            outcome = _relabel_one(settings, client, entry)
        except TeacherError as exc:
            if exc.reached:  # one more failure against this turn (not when the teacher is down for every turn)
                _mark(settings, client, entry, None)
            for turn, why in refused if answered else []:
                _mark(settings, client, turn, why)
            raise
        if isinstance(outcome, str) and outcome.startswith(REFUSED):
            refused.append((entry, outcome))
            left[outcome] += 1
            if not answered and len(refused) >= REFUSALS_IN_A_ROW:
                raise TeacherError(
                    f"the teacher refused the first {len(refused)} requests and answered none: check its "
                    "configuration (tool calls enabled?); nothing was marked",
                    502,
                    "teacher_error",
                )
            continue
        answered = answered or outcome not in (RAW_GONE, CANARY_COPY)
        if isinstance(outcome, dict):
            relabelled.append(outcome)
            continue
        left[outcome] += 1
        if outcome != DECIDED_MEANWHILE:  # a person's to decide: not asked again
            _mark(settings, client, entry, outcome)
    for entry, outcome in refused if answered else []:
        _mark(settings, client, entry, outcome)
    return {
        "asked": len(waiting),
        "relabelled": len(relabelled),
        "left_for_a_person": dict(sorted(left.items())),
        "decisions": relabelled,
    }


DECIDED_MEANWHILE = "a person decided it meanwhile"
RAW_GONE = "its raw record is gone (retention)"
CANARY_COPY = "the teacher answered it already (a canary's teacher copy)"
REFUSED = "the teacher refused the request"
TEACHER_REFUSALS = (400, 413, 422)  # the teacher refused this one request (too long, filtered): the next may pass
REFUSALS_IN_A_ROW = 3  # refused from the start of a run and nothing answered: the teacher, not the turns
MAX_FAILURES = 3  # a turn the teacher failed on this often (a timeout, a 5xx) is left for a person


def _tried_uri(settings: Settings, record_id: str) -> str:
    """The marker of a turn the teacher could not relabel (apart from the decisions: `decisions` lists those)."""
    return f"{settings.zone('raw').rstrip('/')}/{REVIEWS_DIR}/_relabel/{_digest(record_id)}.json"


def _tried(settings: Settings, record_id: str) -> dict[str, Any]:
    uri = _tried_uri(settings, record_id)
    return read_json(uri) if exists(uri) else {}


def _mark(settings: Settings, client: TeacherClient, entry: dict[str, Any], reason: str | None) -> None:
    """Leave a turn for a person (`reason`), or count one more failure of the teacher on it (None): at
    `MAX_FAILURES` it is left for a person too."""
    from datetime import datetime

    marker = _tried(settings, entry["record_id"])
    if reason is None:
        marker["failures"] = int(marker.get("failures") or 0) + 1
        if marker["failures"] >= MAX_FAILURES:
            reason = f"the teacher failed on it {marker['failures']} times"
    marker.update(
        record_id=entry["record_id"], teacher=client.model, at=datetime.now(UTC).isoformat(timespec="seconds")
    )
    if reason is not None:
        marker["reason"] = reason
    write_json(_tried_uri(settings, entry["record_id"]), marker)


def _relabel_one(settings: Settings, client: TeacherClient, entry: dict[str, Any]) -> dict[str, Any] | str:
    """The decision written for one queued turn, or why it is left for a person."""
    from pipelines.clients.teacher import TeacherError

    if entry.get("teacher_copy"):  # a canary's: the teacher answered it already, and its answer trains
        return CANARY_COPY
    try:
        record = _raw_record(settings, entry["record_id"], entry["dt"])
    except ReviewError:
        return RAW_GONE
    try:
        answer = client.complete(record["request"]["messages"], record["request"].get("tools"))
    except TeacherError as exc:
        if exc.upstream_status in TEACHER_REFUSALS:
            return f"{REFUSED} (HTTP {exc.upstream_status})"
        raise
    call = _first_call(answer.message)
    if call is None or not call["name"]:
        return "the teacher made no call" if call is None else "the teacher's call names no tool"
    if call == teacher_call(record):  # the raw answer, before redaction
        return "the teacher gave the answer that was rated down"
    try:
        return decide(settings, entry["record_id"], True, call, f"teacher:{answer.model}", "teacher", entry)
    except ReviewError as exc:
        if exc.kind == "decided":
            return DECIDED_MEANWHILE
        if exc.kind == "schema":
            return "the teacher's call breaks its tool's schema"
        return "the teacher's call is not one of the turn's tools"


def _first_call(message: dict[str, Any]) -> dict[str, Any] | None:
    """The teacher's answer's first tool call as {name, arguments}; None without one, or when it cannot be
    parsed (an upstream's answer, not yet checked as a logged record is: `logs.schema.teacher_call`)."""
    from pipelines.toolcall.calls import parse_call

    calls = message.get("tool_calls") or []
    if not calls or not isinstance(calls[0], dict):
        return None
    function = calls[0].get("function") or {}
    return parse_call(json.dumps({"name": function.get("name"), "arguments": function.get("arguments") or "{}"}))
