"""Prep wiring: read a window of raw partitions, run the nodes, write the zones and the manifest.

Every raw line ends in exactly one place (clean example, held (a clean record whose label does not
train: `prep.labels`, kept in the clean logs with the reason), quarantine with a reason, or removed as a
duplicate of a kept record, which is also listed in quarantine with reason `duplicate`);
`input = clean + held + quarantined + duplicates` is checked on every run and written to the manifest.
The `rated` table copies the clean records people rated (trained, held or deduplicated) in their sessions' splits,
for KTO (`prep.thumbs`): a view of clean records, not another place a line ends in.
A raw `.gz` file that cannot be decompressed whole is not read at all: it is listed in the manifest's
`unreadable_files` with the reason (and named in the message), and left in the raw zone as it is.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipelines import __version__
from pipelines.config import REPO_ROOT, Settings
from pipelines.errors import DataProblem
from pipelines.locks import shared_lock
from pipelines.logs.feedback import read_feedback
from pipelines.logs.raw import unreadable_reason
from pipelines.logs.tools import TOOLSET_VERSION
from pipelines.logs.toolsets import extra_tool_names, registered_catalogue
from pipelines.prep import nodes
from pipelines.prep.late import LATE_PREFIX, stage_late_ratings
from pipelines.redact import PII_TYPES
from pipelines.storage import exists, glob, move, remove, window_partitions, write_json
from pipelines.toolcall.grammar import constraint
from pipelines.window import DateWindow

OUTPUT_TABLES = ("examples", "clean_logs", "quarantine", "rated")
VAL_SHARE = 0.1
TEST_SHARE = 0.1


class PrepError(DataProblem):
    """Prep cannot produce a dataset for this window; the message says why."""


class CountMismatch(PrepError):
    """Records were lost or invented between input and outputs."""


@dataclass
class PrepResult:
    window: str
    run_id: str
    input_records: int
    clean: int
    quarantined: int
    duplicates: int
    examples_by_split: dict[str, int]
    reasons: dict[str, int]
    redactions: dict[str, int]
    manifest_uri: str
    message: str
    seconds: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)
    unreadable_files: dict[str, str] = field(default_factory=dict)  # raw file -> why it was not read
    held: int = 0  # clean records whose label does not train (prep.labels), kept in the clean logs
    label_sources: dict[str, int] = field(default_factory=dict)  # the examples by who wrote their answer

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def zone_paths(settings: Settings) -> dict[str, str]:
    curated, quarantine = settings.zone("curated"), settings.zone("quarantine")
    return {
        "examples": f"{curated}/examples",
        "clean_logs": f"{curated}/clean_logs",
        "rated": f"{curated}/rated",
        "quarantine": f"{quarantine}/records",
        "manifests": f"{curated}/manifests",
        "staging": f"{curated}/_staging",
    }


def raw_files_for(settings: Settings, window: DateWindow, *, late_copies: bool = True) -> list[str]:
    """The window's raw files. A late-ratings copy (`prep/late.py`: earlier turns rated during a window, staged in
    its last day) counts for the window it was staged for only, and not at all with `late_copies=False` (the drift
    monitor: a day's traffic, not copies of older turns)."""
    raw = settings.zone("raw")
    own = f"{LATE_PREFIX}{window.label}.jsonl"
    files: list[str] = []
    for day in window.days():
        for pattern in ("*.jsonl", "*.jsonl.gz"):
            for uri in glob(f"{raw}/dt={day.isoformat()}/{pattern}"):
                name = uri.rsplit("/", 1)[-1]
                if name.startswith(LATE_PREFIX) and (not late_copies or name != own):
                    continue
                files.append(uri)
    return files


def code_version() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 (git on PATH, read-only)
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = "unknown"
    return f"{__version__}+{sha}"


def run_prep(settings: Settings, window: DateWindow, spark: Any = None, run_id: str | None = None) -> PrepResult:
    """Prepare the raw partitions of `window`; replace that window's outputs; return the counts.

    Every `.gz` raw file is first decompressed to its end with Python's gzip (`unreadable_reason`): a
    corrupt or truncated one is left out of the run (none of its lines is counted), left in the raw
    zone untouched (raw is immutable), and recorded in the manifest's `unreadable_files` with the
    reason; the message names it, so it can be re-ingested and the window prepared again. A window
    whose every file is unreadable raises PrepError and leaves the previous outputs as they are."""
    from pyspark.sql import functions as F

    from pipelines.clients.spark import get_spark

    started = time.perf_counter()
    run_id = run_id or f"prep-{window.label}-{uuid.uuid4().hex[:8]}"
    stage_late_ratings(settings, window)  # turns of earlier days rated during this window join it
    files, unreadable = _readable_files(settings, window)
    spark = spark or get_spark(settings)
    paths = zone_paths(settings)
    staging = f"{paths['staging']}/{run_id}"

    lines = spark.read.text(files).withColumn("source_file", F.input_file_name())
    non_blank = lines.filter(F.trim("value") != "")
    prepared = _prepare_to_staging(spark, settings, non_blank, staging)
    input_records = non_blank.count()

    status_counts = _count_by(prepared, "status")
    if sum(status_counts.values()) != input_records:
        raise CountMismatch(f"prepare returned {sum(status_counts.values())} rows for {input_records} input lines")

    frames = _Frames.cut(prepared)
    # Write the new outputs next to the tables first; the window's old partitions are replaced only
    # after every write succeeded (a failed or killed write leaves the last good output in place).
    out = {name: f"{staging}/out/{name}" for name in OUTPUT_TABLES}
    try:
        _write_tables(frames, out, run_id)
    except BaseException:
        frames.release()
        remove(staging)  # nothing was swapped in yet: the tables are as the last good run left them
        raise

    try:  # a failed count or statistic leaves the tables as they were and no staging behind
        counts = _count_outputs(frames, status_counts, input_records)
    except BaseException:
        frames.release()
        remove(staging)
        raise
    frames.release()
    limits = grammar_limits(settings.zone("raw"), [t for d in counts.tool_dist.values() for t in d])
    message = _prep_message(window, counts, limits, unreadable)
    manifest = _manifest(settings, window, run_id, files, unreadable, counts, limits, paths, message)
    # Swap the window's partitions in and write its manifest under the tables' lock (two runs never
    # interleave, and no later prep overwrites a manifest a features step is completing). The window's
    # own manifest only: `curated/manifest.json` (the current training set) moves when the features step
    # has built this window's training set, and only forward (see features.pipeline).
    with window_lock(settings, window):
        for name in OUTPUT_TABLES:
            _swap_window(out[name], paths[name], window, f"{staging}/replaced/{name}")
        manifest_uri = write_json(f"{paths['manifests']}/{window.label}.json", manifest)
    remove(staging)
    return PrepResult(
        window=str(window),
        run_id=run_id,
        input_records=input_records,
        clean=counts.clean,
        quarantined=counts.quarantined,
        duplicates=counts.duplicates,
        examples_by_split=manifest["examples_by_split"],
        reasons=manifest["quarantine_reasons"],
        redactions=counts.redactions,
        manifest_uri=manifest_uri,
        message=message,
        seconds=round(time.perf_counter() - started, 2),
        outputs=manifest["outputs"],
        unreadable_files=unreadable,
        held=counts.held,
        label_sources=manifest["label_sources"],
    )


def _readable_files(settings: Settings, window: DateWindow) -> tuple[list[str], dict[str, str]]:
    """The window's raw files that decompress whole, and the unreadable ones with why; PrepError when there
    are no raw files, or none readable."""
    files = raw_files_for(settings, window)
    if not files:
        raise PrepError(f"no raw partitions for {window} under {settings.zone('raw')}: ingest the window first")
    unreadable = {f: reason for f in files if (reason := unreadable_reason(f))}
    files = [f for f in files if f not in unreadable]
    if not files:
        raise PrepError(
            f"every raw file of {window} is unreadable: "
            + "; ".join(f"{f}: {r}" for f, r in unreadable.items())
            + "; re-ingest them"
        )
    return files, unreadable


def _prepare_to_staging(spark: Any, settings: Settings, non_blank: Any, staging: str) -> Any:
    """Run `nodes.prepare` over the non-blank lines into the run's staging folder; the prepared rows read back."""
    tools = registered_catalogue(settings.zone("raw"))
    feedback = read_feedback(settings.zone("raw"))  # ratings sent after the turns (gateway /v1/feedback)
    nodes.prepare(non_blank, tools, feedback, settings.quality.train_label_sources).write.mode("overwrite").parquet(
        staging
    )
    return spark.read.parquet(staging)


def _count_by(frame: Any, column: str) -> dict[Any, int]:
    """Rows of `frame` per value of `column`."""
    from pyspark.sql import functions as F

    return {r[column]: r["n"] for r in frame.groupBy(column).agg(F.count("*").alias("n")).collect()}


@dataclass(frozen=True)
class _Frames:
    """The prepared rows and the frames cut from them; `marked` and `examples` are persisted until `release`."""

    prepared: Any
    clean: Any
    marked: Any  # the clean rows, each with `duplicate_of`
    kept: Any
    duplicates: Any
    examples: Any
    rated: Any  # the clean rows people rated (up or down), examples-shaped: a session's split, a copy its twin's

    @classmethod
    def cut(cls, prepared: Any) -> _Frames:
        """Mark the clean rows' duplicates and split the kept rows that train into train/val/test."""
        clean = prepared.filter("status = 'clean'")
        marked = nodes.mark_duplicates(clean).persist()
        kept = marked.filter("duplicate_of IS NULL")
        duplicates = marked.filter("duplicate_of IS NOT NULL")
        # clean records whose label does not train (prep.labels) stay in the clean logs, `held` with the reason
        examples = nodes.assign_splits(kept.filter("held IS NULL"), VAL_SHARE, TEST_SHARE, salt="flywheel").persist()
        rated = nodes.rated_rows(marked, examples, VAL_SHARE, TEST_SHARE, salt="flywheel")
        return cls(prepared, clean, marked, kept, duplicates, examples, rated)

    def release(self) -> None:
        """Unpersist the cached frames."""
        self.marked.unpersist()
        self.examples.unpersist()


def _write_tables(frames: _Frames, out: dict[str, str], run_id: str) -> None:
    """Write the examples, clean logs, quarantine and rated tables to the staging folders `out`."""
    frames.examples.select(*nodes.EXAMPLE_COLUMNS).write.mode("overwrite").partitionBy("split", "dt").parquet(
        out["examples"]
    )
    frames.kept.select(*nodes.CLEAN_LOG_COLUMNS).write.mode("overwrite").partitionBy("dt").parquet(out["clean_logs"])
    frames.rated.select(*nodes.RATED_COLUMNS).write.mode("overwrite").partitionBy("split", "dt").parquet(out["rated"])
    nodes.quarantine_rows(frames.prepared, frames.duplicates, run_id).write.mode("overwrite").partitionBy("dt").parquet(
        out["quarantine"]
    )


@dataclass(frozen=True)
class _Counts:
    """Where the window's records went, and the statistics the manifest records."""

    input: int
    clean: int
    held: int
    quarantined: int
    duplicates: int
    held_reasons: dict[str, int]
    label_sources: dict[str, int]
    reasons: dict[str, int]
    redactions: dict[str, int]
    by_split: dict[str, int]
    tool_dist: dict[str, dict[str, int]]
    content_digest: str


def _count_outputs(frames: _Frames, status_counts: dict[str, int], input_records: int) -> _Counts:
    """Count every output, check `input = clean + held + quarantined + duplicates` (CountMismatch), and compute
    the manifest's statistics."""
    from pyspark.sql import functions as F

    n_kept = frames.examples.count()
    n_dup = frames.duplicates.count()
    n_bad = status_counts.get("quarantined", 0)
    held_reasons = _count_by(frames.kept.filter("held IS NOT NULL"), "held")
    n_held = sum(held_reasons.values())
    if n_kept + n_held + n_bad + n_dup != input_records:
        raise CountMismatch(
            f"input {input_records} != clean {n_kept} + held {n_held} + quarantined {n_bad} + duplicates {n_dup}"
        )
    label_sources = _count_by(frames.examples, "label_source")

    reasons = _count_by(frames.prepared.filter("status = 'quarantined'"), "reason")
    redaction_row = frames.clean.select(*[F.sum(f"redacted_{t.lower()}").alias(t) for t in PII_TYPES]).first()
    redactions = {t: int(redaction_row[t] or 0) for t in PII_TYPES}
    per_split_tool = frames.examples.groupBy("split", "tool").agg(F.count("*").alias("n")).collect()
    by_split: dict[str, int] = {}
    tool_dist: dict[str, dict[str, int]] = {}
    for r in per_split_tool:
        by_split[r["split"]] = by_split.get(r["split"], 0) + r["n"]
        tool_dist.setdefault(r["split"], {})[r["tool"]] = r["n"]
    content_digest = nodes.digest(
        frames.examples, ["record_id", "split", "system_prompt", "messages_json", "target_json"]
    )
    return _Counts(
        input_records,
        n_kept,
        n_held,
        n_bad,
        n_dup,
        held_reasons,
        label_sources,
        reasons,
        redactions,
        by_split,
        tool_dist,
        content_digest,
    )


def _prep_message(window: DateWindow, counts: _Counts, limits: dict[str, str], unreadable: dict[str, str]) -> str:
    """The run's one-line summary: the counts, the tools the grammar does not fully constrain, the skipped files."""
    if counts.input == 0:
        message = f"{window}: the raw partitions are empty; nothing to prepare"
    elif counts.clean == 0:
        message = (
            f"{window}: all {counts.input} records were quarantined, held (labels that do not train: "
            f"{counts.held_reasons}) or duplicates ({counts.reasons}); no examples"
        )
    else:
        message = (
            f"{window}: {counts.input} records -> {counts.clean} examples, {counts.held} held (labels that do not "
            f"train), {counts.quarantined} quarantined, {counts.duplicates} duplicates"
        )
    if limits:
        message += "; not fully constrained by the tool-call grammar: " + "; ".join(
            f"{name} {how}" for name, how in limits.items()
        )
    if unreadable:
        message += (
            f"; {len(unreadable)} unreadable raw file(s) skipped, left in place and listed in the "
            f"manifest (re-ingest, then prepare the window again): {', '.join(sorted(unreadable))}"
        )
    return message


def _manifest(
    settings: Settings,
    window: DateWindow,
    run_id: str,
    files: list[str],
    unreadable: dict[str, str],
    counts: _Counts,
    limits: dict[str, str],
    paths: dict[str, str],
    message: str,
) -> dict[str, Any]:
    """The window's manifest: inputs, counts, statistics, versions and outputs."""
    c = counts
    return {
        "run_id": run_id,
        "window": {"start": window.start.isoformat(), "end": window.end.isoformat()},
        "created_at": datetime.now(UTC).isoformat(),
        "input_partitions": sorted({f.rsplit("/", 2)[-2] for f in [*files, *unreadable]}),
        "input_files": files,
        "unreadable_files": [{"file": f, "reason": r} for f, r in sorted(unreadable.items())],
        "counts": {
            "input": c.input,
            "clean": c.clean,
            "held": c.held,
            "quarantined": c.quarantined,
            "duplicates": c.duplicates,
            "reconciled": c.clean + c.held + c.quarantined + c.duplicates == c.input,
        },
        "label_sources": dict(sorted(c.label_sources.items())),
        "held_reasons": dict(sorted(c.held_reasons.items())),
        "quarantine_reasons": dict(sorted(c.reasons.items())),
        "examples_by_split": dict(sorted(c.by_split.items())),
        "tool_distribution": {s: dict(sorted(d.items())) for s, d in sorted(c.tool_dist.items())},
        "redactions": c.redactions,
        "content_digest": c.content_digest,
        "code_version": code_version(),
        "toolset_version": TOOLSET_VERSION,
        "imported_tools": extra_tool_names(settings.zone("raw")),
        "grammar_limits": limits,  # the window's tools the grammar does not fully constrain, and why
        "outputs": {k: v for k, v in paths.items() if k not in ("staging", "manifests")},
        "message": message,
    }


def window_lock(settings: Settings, window: DateWindow, timeout_s: float = 3600):
    """The curated tables' write lock: held while a step replaces a window's partitions (prep's swap and
    manifest, the features step's writes). One lock for every window, since windows overlap (a daily run
    and a 7-day run share days): two runs replace their partitions one after the other, never
    interleaved. The swap itself is renames (seconds); features hold it for their Spark writes."""
    return shared_lock(
        f"{settings.zone('curated')}/_locks/tables",
        timeout_s,
        f"the curated tables (window {window})",
        settings.state_lock_uri,
    )


def _partition_suffix(partition: str) -> str:
    """`split=S/dt=D` or `dt=D`: a partition folder's place inside its table."""
    return "/".join(c for c in partition.rstrip("/").split("/")[-2:] if c.startswith(("split=", "dt=")))


def _swap_window(new_table: str, table_uri: str, window: DateWindow, replaced: str) -> None:
    """Replace the window's partitions of `table_uri` by those written to `new_table` (renames only).

    The old partitions are moved aside first and deleted with the staging folder, so a re-run
    replaces them exactly (no stale split folders) and a crash in between loses nothing: the old
    partitions are still under the run's staging folder."""
    days = window.isoformat_days()
    if not exists(table_uri):  # the first run: the whole table (with Spark's schema file for an empty one)
        move(new_table, table_uri)
        return
    for part in window_partitions(table_uri, days):
        move(part, f"{replaced}/{_partition_suffix(part)}")
    for part in window_partitions(new_table, days):
        move(part, f"{table_uri}/{_partition_suffix(part)}")


def grammar_limits(raw_zone: str, names: list[str]) -> dict[str, str]:
    """Of the tools `names` (those a window uses), the ones the tool-call grammar does not fully constrain,
    with how far it does (`toolcall.grammar.constraint`): prep's manifest and the quality report list them."""
    specs = registered_catalogue(raw_zone)
    found = {
        name: constraint(name, specs[name]["function"].get("parameters"))
        for name in sorted(set(names))
        if name in specs
    }
    return {name: how for name, how in found.items() if how != "fully"}
