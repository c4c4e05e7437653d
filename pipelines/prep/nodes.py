"""Prep nodes: pure functions, per record (`prepare_line`) and per DataFrame (Spark).

`prepare_line` decides, for one raw line, whether it is clean or quarantined (with the reason from
`pipelines.logs.schema.check_line`), redacts PII in text and arguments, and builds the fields of
the SFT example. Spark runs it over partitions with `mapInPandas`; the DataFrame nodes then dedupe,
split and count. A single-process engine can run the same `prepare_line` (see bench/prep.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from pipelines.logs.schema import Reason, check_line
from pipelines.prep.labels import TRAINED_BY_DEFAULT, held_reason, label_source
from pipelines.redact import PII_TYPES, redact_text, redact_value
from pipelines.toolcall.calls import NO_TOOL as ABSTAIN
from pipelines.toolcall.calls import target_json
from pipelines.toolcall.prompt import system_prompt, tools_json

if TYPE_CHECKING:
    from datetime import datetime

    import pandas as pd
    from pyspark.sql import DataFrame

MAX_QUARANTINED_LINE = 20_000

# Output of `prepare_line`, one row per input line (Spark DDL; order matters for mapInPandas).
PREPARED_SCHEMA = ", ".join(
    [
        "status string",
        "reason string",
        "detail string",
        "source_file string",
        "raw_redacted string",
        "record_id string",
        "session_id string",
        "customer_id string",
        "workload_id string",
        "event_time string",
        "turn_index int",
        "model string",
        "country string",
        "currency string",
        "channel string",
        "feedback string",
        "latency_ms double",
        "retrieval_latency_ms double",
        "prompt_tokens int",
        "completion_tokens int",
        "tool string",
        "arguments_json string",
        "category string",
        "amount double",
        "price_asked double",
        "request_text string",
        "dedupe_key string",
        "messages_json string",
        "tools_offered array<string>",
        "tools_json string",
        "system_prompt string",
        "target_json string",
        "approx_tokens int",
        "label_source string",
        "held string",
        *(f"redacted_{t.lower()} int" for t in PII_TYPES),
    ]
)
PREPARED_COLUMNS = [c.split(" ")[0] for c in PREPARED_SCHEMA.split(", ")]

_SPACES = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """What near-duplicates share: case, spacing and trailing punctuation removed."""
    return _SPACES.sub(" ", text.lower()).strip().rstrip("!?.,; ")


def prepare_line(
    line: str | bytes,
    source_file: str = "",
    tools: Mapping[str, dict[str, Any]] | None = None,
    feedback: Mapping[str, str] | None = None,
    trained: Collection[str] = TRAINED_BY_DEFAULT,
) -> dict[str, Any]:
    """One raw line -> one row: clean (with its SFT fields) or quarantined (with a reason).

    `tools`: the catalogue including imported toolsets (default: ours). `feedback`: ratings given after
    the turn was logged (the gateway's `/v1/feedback`, by record id), which replace the record's own.
    `trained`: the label sources that train (`prep.labels`); a clean row that does not train is `held`."""
    row: dict[str, Any] = dict.fromkeys(PREPARED_COLUMNS)
    row["source_file"] = source_file
    verdict = check_line(line, tools)
    if verdict.reason is not None:
        return _quarantined_row(row, line, verdict.reason, verdict.detail)
    if verdict.record is None or verdict.timestamp is None:  # check_line: a verdict without a reason has both
        raise ValueError(f"a clean verdict without its record or timestamp: {verdict!r}")
    return _clean_row(row, verdict.record, verdict.timestamp, feedback, trained)


def _quarantined_row(row: dict[str, Any], line: str | bytes, reason: Reason, detail: str) -> dict[str, Any]:
    """`row` as a quarantined line: the reason, the redacted line and, when it is JSON, its ids."""
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    row.update(
        status="quarantined",
        reason=reason.value,
        detail=redact_text(detail),
        raw_redacted=redact_text(text[:MAX_QUARANTINED_LINE]),
    )
    try:  # keep the ids when the line is JSON, so people can find the record
        raw = orjson.loads(line)
        if isinstance(raw, dict):
            row.update(
                record_id=_str(raw.get("record_id")),
                session_id=_str(raw.get("session_id")),
                customer_id=_str(raw.get("customer_id")),
                event_time=_str(raw.get("timestamp")),
            )
    except orjson.JSONDecodeError:
        pass
    for t in PII_TYPES:
        row[f"redacted_{t.lower()}"] = 0
    return row


def _clean_row(
    row: dict[str, Any],
    r: dict[str, Any],
    timestamp: datetime,
    feedback: Mapping[str, str] | None,
    trained: Collection[str],
) -> dict[str, Any]:
    """`row` as a clean record (`r`, logged at `timestamp`): PII redacted (and counted), its label source, and
    the SFT example's fields."""
    counts: Counter[str] = Counter()
    conversation = conversation_of(r["request"]["messages"], counts)
    calls = r["response"]["choices"][0]["message"].get("tool_calls") or []
    if calls:
        tool = calls[0]["function"]["name"]
        arguments = redact_value(orjson.loads(calls[0]["function"]["arguments"]), counts)
    else:
        tool, arguments = ABSTAIN, None
    arguments_json = json.dumps(arguments, separators=(",", ":"), sort_keys=True) if arguments is not None else None
    user_turns = [m["content"] or "" for m in conversation if m["role"] == "user"]
    tools_offered = [t["function"]["name"] for t in r["request"]["tools"]]
    event_time = timestamp.isoformat(timespec="microseconds")
    day = event_time[:10]
    offered_json = tools_json(r["request"]["tools"])
    system = system_prompt(offered_json, day)
    messages_json = json.dumps(conversation, separators=(",", ":"), ensure_ascii=False)
    target = target_json(tool, arguments)
    key_source = " | ".join(normalize_text(u) for u in user_turns) + "\x1f" + tool + "\x1f" + (arguments_json or "")
    args = arguments or {}
    rating = (feedback or {}).get(r["record_id"], r["feedback"])
    source = label_source(r)
    row.update(label_source=source, held=held_reason(source, rating, trained))
    row.update(
        status="clean",
        record_id=r["record_id"],
        session_id=r["session_id"],
        customer_id=r["customer_id"],
        workload_id=r["workload_id"],
        event_time=event_time,
        turn_index=r["turn_index"],
        model=r["model"],
        country=r["country"],
        currency=r["currency"],
        channel=r["channel"],
        feedback=rating,
        latency_ms=float(r["latency_ms"]),
        retrieval_latency_ms=float(r["retrieval_latency_ms"]),
        prompt_tokens=r["prompt_tokens"],
        completion_tokens=r["completion_tokens"],
        tool=tool,
        arguments_json=arguments_json,
        category=_str(args.get("category")),
        amount=_num(args.get("amount")),
        price_asked=_num(args.get("max_price")),
        request_text=user_turns[-1] if user_turns else "",
        dedupe_key=hashlib.sha1(key_source.encode(), usedforsecurity=False).hexdigest(),
        messages_json=messages_json,
        tools_offered=tools_offered,
        tools_json=offered_json,
        system_prompt=system,
        target_json=target,
        approx_tokens=(len(system) + len(messages_json) + len(target)) // 4,
    )
    for t in PII_TYPES:
        row[f"redacted_{t.lower()}"] = counts[t]
    return row


def conversation_of(messages: list[dict[str, Any]], counts: Counter[str] | None = None) -> list[dict[str, Any]]:
    """A request's messages (OpenAI shape) as the conversation the prompt shows: system messages left
    out (ours replaces them), calls as {name, arguments}. With `counts` (prep), PII is redacted and
    counted; without (the gateway serving a live request), the text stays as the caller sent it, so a
    call can carry the caller's real values."""
    text = (lambda t: redact_text(t, counts)) if counts is not None else (lambda t: t)
    value = (lambda v: redact_value(v, counts)) if counts is not None else (lambda v: v)
    conversation = []
    for m in messages:
        if m["role"] == "system":
            continue
        msg: dict[str, Any] = {"role": m["role"], "content": text(m.get("content") or "") or None}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"name": c["function"]["name"], "arguments": value(orjson.loads(c["function"]["arguments"]))}
                for c in m["tool_calls"]
            ]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        conversation.append(msg)
    return conversation


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def prepare_batches(
    batches: Iterator[pd.DataFrame],
    tools: Mapping[str, dict[str, Any]] | None = None,
    feedback: Mapping[str, str] | None = None,
    trained: Collection[str] = TRAINED_BY_DEFAULT,
) -> Iterator[pd.DataFrame]:
    """mapInPandas body: (value, source_file) lines -> PREPARED_SCHEMA rows."""
    import pandas as pd

    for batch in batches:
        rows = [prepare_line(v, f, tools, feedback, trained) for v, f in zip(batch["value"], batch["source_file"])]
        frame = pd.DataFrame(rows, columns=PREPARED_COLUMNS)
        for col in (
            "turn_index",
            "prompt_tokens",
            "completion_tokens",
            "approx_tokens",
            *(f"redacted_{t.lower()}" for t in PII_TYPES),
        ):
            frame[col] = frame[col].astype("Int32")
        yield frame


# ---- DataFrame nodes ------------------------------------------------------------------------
def prepare(
    lines: DataFrame,
    tools: Mapping[str, dict[str, Any]] | None = None,
    feedback: Mapping[str, str] | None = None,
    trained: Collection[str] = TRAINED_BY_DEFAULT,
) -> DataFrame:
    """Raw text lines (value, source_file) -> prepared rows with a typed `event_timestamp`.

    `dt` is the raw partition a row came from (not its timestamp), so each output partition is
    written from exactly one input partition and re-running a date replaces just that date.
    """
    from pyspark.sql import functions as F

    prepared = lines.mapInPandas(
        partial(prepare_batches, tools=tools, feedback=feedback, trained=tuple(trained)), PREPARED_SCHEMA
    )
    return prepared.withColumn("event_timestamp", F.try_to_timestamp("event_time")).withColumn(
        "dt", F.regexp_extract("source_file", r"dt=([0-9]{4}-[0-9]{2}-[0-9]{2})", 1)
    )


def mark_duplicates(clean: DataFrame) -> DataFrame:
    """Add `duplicate_of`: the record kept for the same normalized request + tool call: one that trains before
    a held one (a reviewer's correction of a down-rated turn, or the teacher's answer to a request our model
    also answered, is never dropped as the duplicate of a record that does not train), then the earliest."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("dedupe_key").orderBy(
        F.col("held").isNotNull(), "event_timestamp", "record_id", "source_file"
    )
    return (
        clean.withColumn("_rank", F.row_number().over(w))
        .withColumn("duplicate_of", F.when(F.col("_rank") > 1, F.first("record_id").over(w)))
        .drop("_rank")
    )


def assign_splits(kept: DataFrame, val_share: float, test_share: float, salt: str) -> DataFrame:
    """Split by session (never shared), stratified by the tool of each session's first turn."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    first = Window.partitionBy("session_id").orderBy("turn_index", "event_timestamp")
    sessions = (
        kept.withColumn("_n", F.row_number().over(first))
        .filter("_n = 1")
        .select("session_id", F.col("tool").alias("stratum"))
    )
    by_stratum = Window.partitionBy("stratum").orderBy(F.xxhash64("session_id", F.lit(salt)), "session_id")
    sessions = sessions.withColumn("_p", F.percent_rank().over(by_stratum)).withColumn(
        "split",
        F.when(F.col("_p") >= 1 - test_share, "test")
        .when(F.col("_p") >= 1 - test_share - val_share, "val")
        .otherwise("train"),
    )
    return kept.join(sessions.select("session_id", "split"), "session_id")


def rated_rows(marked: DataFrame, examples: DataFrame, val_share: float, test_share: float, salt: str) -> DataFrame:
    """The clean rows people rated (up or down, whether they train, are held or were dropped as a duplicate: the
    dedupe keeps one answer for SFT, and every rating of it is still a signal), each in the split its session has
    among the examples; a session with no example (every turn held) is split by the same rule among such
    sessions. A duplicate takes the split of the example it duplicates, so a rated copy never trains on what
    the test split scores. What KTO learns from (`prep.thumbs`, which resolves repeated and contradicting
    ratings): redacted and split by session as SFT is."""
    from pyspark.sql import functions as F

    rated = marked.filter("feedback IN ('up', 'down')")
    splits = examples.select("session_id", "split").distinct()
    placed = rated.join(splits, "session_id")
    alone = assign_splits(rated.join(splits, "session_id", "left_anti"), val_share, test_share, salt)
    twins = examples.select(F.col("record_id").alias("duplicate_of"), F.col("split").alias("_twin"))
    return (
        placed.unionByName(alone)
        .join(twins, "duplicate_of", "left")
        .withColumn("split", F.coalesce("_twin", "split"))
        .drop("_twin")
    )


EXAMPLE_COLUMNS = [
    "record_id",
    "session_id",
    "customer_id",
    "event_timestamp",
    "workload_id",
    "tool",
    "tools_offered",
    "tools_json",
    "system_prompt",
    "messages_json",
    "target_json",
    "approx_tokens",
    "country",
    "currency",
    "channel",
    "label_source",
    "split",
    "dt",
]
RATED_COLUMNS = [*EXAMPLE_COLUMNS[:-2], "feedback", "held", "duplicate_of", "split", "dt"]  # as the examples
CLEAN_LOG_COLUMNS = [
    "record_id",
    "session_id",
    "customer_id",
    "event_timestamp",
    "turn_index",
    "workload_id",
    "tool",
    "arguments_json",
    "category",
    "amount",
    "price_asked",
    "request_text",
    "model",
    "country",
    "currency",
    "channel",
    "feedback",
    "latency_ms",
    "retrieval_latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "label_source",
    "held",
    "dt",
]
QUARANTINE_COLUMNS = [
    "reason",
    "detail",
    "record_id",
    "session_id",
    "customer_id",
    "event_time",
    "source_file",
    "raw_redacted",
    "dt",
]


def quarantine_rows(prepared: DataFrame, duplicates: DataFrame, run_id: str) -> DataFrame:
    from pyspark.sql import functions as F

    bad = prepared.filter("status = 'quarantined'").select(*QUARANTINE_COLUMNS)
    dups = duplicates.select(
        F.lit("duplicate").alias("reason"),
        F.concat(F.lit("duplicate of "), "duplicate_of").alias("detail"),
        "record_id",
        "session_id",
        "customer_id",
        "event_time",
        "source_file",
        F.lit(None).cast("string").alias("raw_redacted"),
        "dt",
    )
    return bad.unionByName(dups).withColumn("run_id", F.lit(run_id)).withColumn("quarantined_at", F.current_timestamp())


def digest(frame: DataFrame, columns: list[str]) -> str:
    """Order-independent content digest of a DataFrame (sum of per-row hashes, and the count)."""
    from pyspark.sql import functions as F

    h = F.sha2(F.concat_ws("\x1f", *[F.coalesce(F.col(c).cast("string"), F.lit("")) for c in columns]), 256)
    row = frame.select(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.conv(F.substring(h, 1, 12), 16, 10).cast("decimal(38,0)")).alias("a"),
        F.sum(F.conv(F.substring(h, 13, 12), 16, 10).cast("decimal(38,0)")).alias("b"),
    ).first()
    if row is None:  # a global aggregate has one row, even over no rows
        raise ValueError("digest: the aggregate returned no row")
    return hashlib.sha256(f"{row['n']}:{row['a']}:{row['b']}".encode()).hexdigest()
