"""Great Expectations (1.x API) gates on Spark DataFrames.

Suites: `raw_logs` (schema, non-null ids, timestamps inside the window, latency range, tool
names in the catalogue, workload ids in the set), `raw_outcomes` (the share of the batch prep had
to quarantine stays under a limit), and `curated_sft` (no PII pattern left, token
length bounds, minimum examples per tool, splits disjoint by session). A failing gate writes Data
Docs HTML and a JSON result, moves the window's curated batch to quarantine (nothing is deleted;
the raw zone is immutable) and raises `QualityGateFailed`, which stops the DAG before training.
The PII checks use independent regexes (not the redactor's code), and results never include the
offending values, so a failing report cannot leak PII.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from typing import TYPE_CHECKING, Any

from pipelines.config import Settings
from pipelines.errors import DataProblem, one_line
from pipelines.logs.tools import TOOL_NAMES, WORKLOADS
from pipelines.logs.toolsets import extra_tool_names
from pipelines.prep.labels import TRUSTED_LABEL_SOURCES
from pipelines.prep.pipeline import grammar_limits, raw_files_for, zone_paths
from pipelines.redact import GATE_PATTERNS
from pipelines.storage import move, window_partitions, write_json
from pipelines.toolcall.budget import DEFAULT_CONTEXT_WINDOW, prompt_ceiling
from pipelines.window import DateWindow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Values never appear in results (PII safety); counts and percentages do.
RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 0, "include_unexpected_rows": False}
RAW_SCHEMA = (
    "record_id string, session_id string, customer_id string, timestamp string, workload_id string, "
    "latency_ms double, retrieval_latency_ms double, "
    "response struct<choices: array<struct<message: struct<tool_calls: array<struct<function: "
    "struct<name: string>>>>>>>"
)


class QualityGateFailed(DataProblem):
    """A gate failed: the batch is quarantined and the flywheel stops before training."""


@dataclass
class SuiteOutcome:
    suite: str
    success: bool
    evaluated: int
    failed: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class QualityReport:
    window: str
    success: bool
    suites: list[SuiteOutcome]
    data_docs: str | None  # the Data Docs site's URL (None: GX found no built site)
    result_uri: str
    quarantined_to: str | None = None
    seconds: float = 0.0
    label_sources: dict[str, int] = field(default_factory=dict)  # the window's examples by who wrote the label
    grammar_limits: dict[str, str] = field(default_factory=dict)  # its tools the grammar does not fully constrain
    # the approx_tokens ceiling and where it came from (the setting, or context window - answer budget)
    prompt_ceiling: dict[str, Any] = field(default_factory=dict)
    # what tuning after SFT can learn from (`signals`): the window's ratings, the rewarded prompts, the pairs
    signals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def failures(self) -> list[str]:
        return [
            f"{s.suite}: {f['expectation']}({f.get('column') or ''})"
            + (f" failing {f['unexpected_count']}" if f.get("unexpected_count") is not None else "")
            for s in self.suites
            for f in s.failed
        ]


def raw_frame(spark: SparkSession, settings: Settings, window: DateWindow) -> DataFrame:
    """Every non-blank raw line of the window, parsed with an explicit schema (bad JSON -> nulls)."""
    from pyspark.sql import functions as F

    lines = spark.read.text(raw_files_for(settings, window)).filter(F.trim("value") != "")
    parsed = lines.select(F.from_json("value", RAW_SCHEMA, {"mode": "PERMISSIVE"}).alias("r")).select("r.*")
    return parsed.select(
        "record_id",
        "session_id",
        "customer_id",
        "workload_id",
        "latency_ms",
        F.to_timestamp("timestamp").alias("event_timestamp"),
        F.col("response.choices")[0]["message"]["tool_calls"][0]["function"]["name"].alias("tool_name"),
    )


def outcome_frame(spark: SparkSession, settings: Settings, window: DateWindow) -> DataFrame:
    """One row per raw line of the window with what prep did with it: clean, duplicate or a reason."""
    from pyspark.sql import functions as F

    days = window.isoformat_days()
    paths = zone_paths(settings)
    clean = (
        spark.read.parquet(paths["examples"])
        .filter(F.col("dt").cast("string").isin(days))
        .select(F.lit("clean").alias("outcome"))
    )
    if window_partitions(paths["quarantine"], days):
        quarantined = (
            spark.read.parquet(paths["quarantine"])
            .filter(F.col("dt").cast("string").isin(days))
            .select(F.col("reason").alias("outcome"))
        )
    else:  # nothing of this window was quarantined (a clean import): no partition, no schema to read
        quarantined = spark.createDataFrame([], "outcome string")
    # held records (a label that does not train: prep.labels) are a good outcome, not a data problem
    if window_partitions(paths["clean_logs"], days):
        logs = spark.read.parquet(paths["clean_logs"]).filter(F.col("dt").cast("string").isin(days))
        held = (
            logs.filter(F.col("held").isNotNull()).select(F.lit("held").alias("outcome"))
            if "held" in logs.columns
            else spark.createDataFrame([], "outcome string")
        )
    else:
        held = spark.createDataFrame([], "outcome string")
    return clean.unionByName(quarantined).unionByName(held)


def curated_frames(spark: SparkSession, settings: Settings, window: DateWindow) -> dict[str, DataFrame]:
    from pyspark.sql import functions as F

    days = window.isoformat_days()
    examples = spark.read.parquet(zone_paths(settings)["examples"]).filter(F.col("dt").cast("string").isin(days))
    tool_counts = examples.groupBy("tool").agg(F.count("*").alias("examples"))
    session_splits = examples.groupBy("session_id").agg(F.countDistinct("split").alias("splits"))
    return {"examples": examples, "tool_counts": tool_counts, "session_splits": session_splits}


def signals(spark: SparkSession, settings: Settings, window: DateWindow, examples: DataFrame) -> dict[str, Any]:
    """The signals tuning after SFT learns from, counted for the report: the window's kept turns by rating
    (`ratings`: up, down, none), the window's training-split examples (`rewarded_prompts`: GRPO draws its prompts,
    up to `tune.grpo.max_prompts`, from the SFT training split) and the preference pairs DPO would train on now
    (`preference_pairs`: `prep.pairs.pair_summary` over the current training set, the last features run's, so
    before this window joins it: by source and split, dropped and quarantined by reason) and the rated answers KTO
    would train on now (`thumbs`: `prep.thumbs.thumb_summary`, the same scope). A failure to count is
    recorded as `error`, never a failed gate: the suites decide."""
    try:
        return _signals(spark, settings, window, examples)
    except Exception as exc:  # noqa: BLE001 (any: the counts inform the report, they never stop the gate)
        return {"error": one_line(exc)}


def _signals(spark: SparkSession, settings: Settings, window: DateWindow, examples: DataFrame) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from pipelines.prep.pairs import collect_pairs, pair_summary
    from pipelines.prep.thumbs import collect_thumbs, thumb_summary

    days = window.isoformat_days()
    clean_logs = zone_paths(settings)["clean_logs"]
    ratings = {"up": 0, "down": 0, "none": 0}
    if window_partitions(clean_logs, days):
        logs = spark.read.parquet(clean_logs).filter(F.col("dt").cast("string").isin(days))
        for row in logs.groupBy("feedback").count().collect():
            key = row["feedback"] if row["feedback"] in ("up", "down") else "none"
            ratings[key] += int(row["count"])
    return {
        "ratings": ratings,
        "rewarded_prompts": examples.filter(F.col("split") == "train").count(),
        "preference_pairs": {"scope": "the current training set", **pair_summary(*collect_pairs(settings))},
        "thumbs": {"scope": "the current training set", **thumb_summary(*collect_thumbs(settings))},
    }


def _suites(settings: Settings, window: DateWindow, max_approx_tokens: int) -> dict[str, list[Any]]:
    import great_expectations as gx

    E = gx.expectations
    q = settings.quality
    start = datetime.combine(window.start, dtime.min)
    end = datetime.combine(window.end + timedelta(days=1), dtime.min)
    raw = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        *[
            E.ExpectColumnValuesToNotBeNull(column=c, mostly=q.raw_mostly)
            for c in ("record_id", "session_id", "customer_id", "event_timestamp")
        ],
        E.ExpectColumnValuesToBeBetween(column="event_timestamp", min_value=start, max_value=end, mostly=q.raw_mostly),
        E.ExpectColumnValuesToBeBetween(
            column="latency_ms", min_value=0, max_value=120_000, strict_min=True, mostly=q.raw_mostly
        ),
        E.ExpectColumnValuesToBeInSet(
            column="tool_name", mostly=q.raw_mostly, value_set=[*TOOL_NAMES, *extra_tool_names(settings.zone("raw"))]
        ),
        E.ExpectColumnValuesToBeInSet(column="workload_id", value_set=list(WORKLOADS), mostly=q.raw_mostly),
    ]
    outcomes = [
        E.ExpectColumnValuesToBeInSet(
            column="outcome", value_set=["clean", "held", "duplicate"], mostly=1 - q.max_quarantined_share
        )
    ]
    examples = [
        E.ExpectTableRowCountToBeBetween(min_value=1),
        *[E.ExpectColumnValuesToNotBeNull(column=c) for c in ("record_id", "session_id", "target_json", "split")],
        E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "val", "test"]),
        E.ExpectColumnValuesToBeBetween(
            column="approx_tokens", min_value=q.min_approx_tokens, max_value=max_approx_tokens
        ),
        E.ExpectColumnValuesToBeInSet(
            column="label_source", value_set=list(TRUSTED_LABEL_SOURCES), mostly=q.min_trusted_label_share
        ),
        *[
            E.ExpectColumnValuesToNotMatchRegex(column=col, regex=pattern, meta={"pii": name})
            for name, pattern in GATE_PATTERNS.items()
            for col in ("messages_json", "target_json")
        ],
    ]
    tool_counts = [E.ExpectColumnValuesToBeBetween(column="examples", min_value=q.min_examples_per_tool)]
    session_splits = [E.ExpectColumnValuesToBeBetween(column="splits", min_value=1, max_value=1)]
    return {
        "raw_logs": raw,
        "raw_outcomes": outcomes,
        "curated_examples": examples,
        "curated_tool_counts": tool_counts,
        "curated_session_splits": session_splits,
    }


def ceiling_of(settings: Settings, examples: Any, context_window: int) -> dict[str, Any]:
    """The curated examples' approx_tokens ceiling: `quality.max_approx_tokens` when set, else the base model's
    context window minus the answer budget of the window's longest target (`toolcall.budget`)."""
    from pyspark.sql import functions as F

    if settings.quality.max_approx_tokens is not None:
        return {"max_approx_tokens": settings.quality.max_approx_tokens, "source": "quality.max_approx_tokens"}
    longest = examples.agg(F.max(F.length("target_json"))).collect()[0][0] or 0
    return {
        "max_approx_tokens": prompt_ceiling(context_window, longest),
        "source": "context window - answer budget",
        "context_window": context_window,
        "longest_target_chars": longest,
    }


def run_gates(
    settings: Settings,
    window: DateWindow,
    spark: SparkSession | None = None,
    raise_on_failure: bool = True,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
) -> QualityReport:
    """The gates on a window; `context_window`: the base model's (the caller knows which is trained), for the
    prompt ceiling when `quality.max_approx_tokens` is unset."""
    import great_expectations as gx
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

    from pipelines.clients.spark import get_spark

    started = time.perf_counter()
    spark = spark or get_spark(settings)
    reports = f"{settings.zone('reports')}/quality"
    context = gx.get_context(mode="file", project_root_dir=reports)
    source = context.data_sources.add_or_update_spark(name="flywheel")
    frames = {
        "raw_logs": raw_frame(spark, settings, window),
        "raw_outcomes": outcome_frame(spark, settings, window),
        **{f"curated_{k}": v for k, v in curated_frames(spark, settings, window).items()},
    }
    ceiling = ceiling_of(settings, frames["curated_examples"], context_window)
    outcomes, documented = [], []
    try:
        for suite_name, expectations in _suites(settings, window, ceiling["max_approx_tokens"]).items():
            suite = context.suites.add_or_update(gx.ExpectationSuite(name=suite_name, expectations=expectations))
            asset = _asset(source, suite_name)
            batch = _batch_definition(asset)
            validation = context.validation_definitions.add_or_update(
                gx.ValidationDefinition(name=suite_name, data=batch, suite=suite)
            )
            checkpoint = context.checkpoints.add_or_update(
                gx.Checkpoint(
                    name=f"{suite_name}_gate",
                    validation_definitions=[validation],
                    result_format=RESULT_FORMAT,
                    actions=[],
                )
            )
            result = checkpoint.run(
                batch_parameters={"dataframe": frames[suite_name]},
                run_id=gx.RunIdentifier(run_name=f"{suite_name}-{window.label}"),
            )
            outcomes.append(_outcome(suite_name, result))
            documented += [*result.run_results, ExpectationSuiteIdentifier(name=suite_name)]
    finally:
        # Data Docs once for the window's results, those validated before an error too (what UpdateDataDocsAction
        # did per checkpoint: each of its builds rewrote the site's index, which lists every run kept)
        if documented:  # GX types the list as one kind of identifier; it documents (and takes) both kinds mixed
            context.build_data_docs(resource_identifiers=documented)  # type: ignore[arg-type]
    docs = context.get_docs_sites_urls()[0]["site_url"]
    success = all(o.success for o in outcomes)
    sources = {
        str(r["label_source"]): int(r["count"])
        for r in frames["curated_examples"].groupBy("label_source").count().collect()
    }
    report = QualityReport(
        window=str(window),
        success=success,
        suites=outcomes,
        data_docs=docs,
        result_uri=f"{reports}/results/{window.label}.json",
        label_sources=dict(sorted(sources.items())),
        grammar_limits=grammar_limits(
            settings.zone("raw"), [r["tool"] for r in frames["curated_tool_counts"].select("tool").collect()]
        ),
        prompt_ceiling=ceiling,
        signals=signals(spark, settings, window, frames["curated_examples"]),
    )
    if not success:
        report.quarantined_to = quarantine_batch(settings, window, report)
    report.seconds = round(time.perf_counter() - started, 2)
    write_json(report.result_uri, report.to_dict())
    if not success and raise_on_failure:
        raise QualityGateFailed(
            f"quality gate failed for {window}: {'; '.join(report.failures)}; "
            f"batch moved to {report.quarantined_to}; Data Docs: {docs}"
        )
    return report


def _asset(source: Any, name: str) -> Any:
    try:
        return source.get_asset(name)
    except LookupError:
        return source.add_dataframe_asset(name=name)


def _batch_definition(asset: Any) -> Any:
    try:
        return asset.get_batch_definition("whole")
    except (KeyError, LookupError):
        return asset.add_batch_definition_whole_dataframe("whole")


def _outcome(suite: str, result: Any) -> SuiteOutcome:
    validation = next(iter(result.run_results.values()))
    failed = []
    for r in validation.results:
        if not r.success:
            kwargs = r.expectation_config.kwargs
            failed.append(
                {
                    "expectation": r.expectation_config.type,
                    "column": kwargs.get("column"),
                    "unexpected_count": (r.result or {}).get("unexpected_count"),
                    "unexpected_percent": (r.result or {}).get("unexpected_percent"),
                    "observed_value": _safe_observed((r.result or {}).get("observed_value")),
                    "pii": (r.expectation_config.meta or {}).get("pii"),
                }
            )
    return SuiteOutcome(suite=suite, success=bool(validation.success), evaluated=len(validation.results), failed=failed)


def _safe_observed(value: Any) -> Any:
    return value if isinstance(value, (int, float)) or value is None else str(value)[:80]


def quarantine_batch(settings: Settings, window: DateWindow, report: QualityReport) -> str:
    """Move the window's curated partitions to quarantine/failed_batches/<window>/ (raw stays as it is)."""
    target = f"{settings.zone('quarantine')}/failed_batches/{window.label}-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    paths = zone_paths(settings)
    for name in ("examples", "clean_logs", "rated"):
        for part in window_partitions(paths[name], window.isoformat_days()):
            relative = part.split(f"/{name}/", 1)[1]
            move(part, f"{target}/{name}/{relative}")
    write_json(f"{target}/gate_result.json", {**report.to_dict(), "raw_files": raw_files_for(settings, window)})
    return target
