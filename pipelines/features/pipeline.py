"""Features wiring: compute snapshots (Spark), register and materialize them (Feast), and build the
training set whose prompts carry the customer's context from a point-in-time join.

`online_context` gives serving the same context string from the online store, so a prompt built at
serving time equals the prompt the model was trained on.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as dtime
from typing import Any

from pipelines.clients import feast as feast_client
from pipelines.config import Settings
from pipelines.features import nodes
from pipelines.locks import shared_lock
from pipelines.logs.schema import ANONYMOUS
from pipelines.prep.pipeline import PrepError, window_lock, zone_paths
from pipelines.security import redact_uri
from pipelines.storage import glob, makedirs, read_bytes, read_json, remove, window_partitions, write_json
from pipelines.toolcall.prompt import format_context, system_prompt
from pipelines.window import DateWindow


@dataclass
class FeaturesResult:
    window: str
    customer_rows: int
    category_rows: int
    feature_views: list[str]
    materialized_views: list[str]
    training_examples: dict[str, int]
    with_context: int
    dataset_uri: str
    registry: str
    online_store: str
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def feature_paths(settings: Settings) -> dict[str, str]:
    zone = settings.zone("features")
    return {"customer": f"{zone}/customer", "category": f"{zone}/category"}


def dataset_uri(settings: Settings) -> str:
    return f"{settings.zone('curated')}/sft"


def rated_uri(settings: Settings) -> str:
    """The rated rows with their training prompts (KTO's table, `prep.thumbs`), beside the SFT set."""
    return f"{settings.zone('curated')}/sft_rated"


def has_offline_data(table_uri: str) -> bool:
    """Whether a feature table holds any Parquet file (Feast's file source fails on a folder without one)."""
    return bool(glob(f"{table_uri}/dt=*/*.parquet"))


def compute_features(settings: Settings, window: DateWindow, spark: Any = None) -> tuple[int, int]:
    from pyspark.sql import functions as F

    from pipelines.clients.spark import get_spark

    spark = spark or get_spark(settings)
    history = nodes.history_window(window)
    clean_logs = zone_paths(settings)["clean_logs"]
    days = history.isoformat_days()
    clean = spark.read.parquet(clean_logs).filter(F.col("dt").cast("string").isin(days))
    paths = feature_paths(settings)
    counts = []
    for name, frame in (
        ("customer", nodes.customer_features(clean, window)),
        ("category", nodes.category_features(clean, window)),
    ):
        for day in window.days():
            remove(f"{paths[name]}/dt={day.isoformat()}")
        frame = frame.persist()
        frame.write.mode("overwrite").partitionBy("dt").parquet(paths[name])
        counts.append(frame.count())
        frame.unpersist()
    return counts[0], counts[1]


VIEW_TABLES = {"customer_profile": "customer", "category_stats": "category"}


def materialize_window(settings: Settings, window: DateWindow) -> list[str]:
    """Fill the online store for the window; a view whose table has no data yet (a window of imported
    turns without product categories, say) is skipped, not an error. Returns the views materialized."""
    start = datetime.combine(window.start, dtime.min, tzinfo=UTC)
    end = datetime.combine(window.end + timedelta(days=1), dtime.min, tzinfo=UTC) + timedelta(seconds=1)
    paths = feature_paths(settings)
    views = [view for view, table in VIEW_TABLES.items() if has_offline_data(paths[table])]
    if views:
        feast_client.materialize(settings, start - timedelta(days=nodes.LONG_DAYS), end, views)
    return views


def _window_frame(uri: str, window: DateWindow) -> Any:
    """A curated table's rows of `window` (split and dt from the partition folders), or None without any."""
    import pandas as pd
    import pyarrow.parquet as pq

    files = [f for part in window_partitions(uri, window.isoformat_days()) for f in glob(f"{part}/*.parquet")]
    frames = []
    for f in files:
        part = pq.read_table(f).to_pandas()
        part["split"] = f.split("split=", 1)[1].split("/", 1)[0]
        part["dt"] = f.split("dt=", 1)[1].split("/", 1)[0]
        frames.append(part)
    return pd.concat(frames, ignore_index=True) if frames else None


def _write_set(frame: Any, out: str, window: DateWindow) -> None:
    """`frame` as the window's partitions of the set at `out` (split/dt; the window's old partitions removed)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for part in window_partitions(out, window.isoformat_days()):
        remove(part)
    if frame is None:
        return
    for (split, dt), group in frame.groupby(["split", "dt"]):
        table = pa.Table.from_pandas(group.drop(columns=["split", "dt"]).sort_values("record_id"), preserve_index=False)
        target = f"{out}/split={split}/dt={dt}"
        makedirs(target)
        pq.write_table(table, f"{target}/part-0.parquet", coerce_timestamps="us", allow_truncated_timestamps=True)


def build_training_set(settings: Settings, window: DateWindow) -> tuple[dict[str, int], int]:
    """Examples of `window` + customer context (point-in-time) -> curated/sft/split=*/dt=*/, and the rated rows
    (prep's `rated` table: what KTO learns from) with the same context -> curated/sft_rated/split=*/dt=*/."""
    import pandas as pd

    examples = _window_frame(zone_paths(settings)["examples"], window)
    if examples is None:
        raise PrepError(f"no curated examples for {window}: run prep (and its quality gate) first")
    rated = _window_frame(zone_paths(settings)["rated"], window)
    frames = [examples] if rated is None else [examples, rated]
    for frame in frames:
        frame["event_timestamp"] = pd.to_datetime(frame["event_timestamp"], utc=True)
    both = pd.concat([f[["record_id", "customer_id", "event_timestamp"]] for f in frames], ignore_index=True)
    contexts = point_in_time_contexts(settings, both.drop_duplicates("record_id"))
    for frame in frames:
        frame["context"] = frame["record_id"].map(contexts).fillna("")
        frame["system_prompt"] = [
            system_prompt(tools, ts.date().isoformat(), ctx or None)
            for tools, ts, ctx in zip(frame["tools_json"], frame["event_timestamp"], frame["context"])
        ]
        frame["approx_tokens"] = (
            frame["system_prompt"].str.len() + frame["messages_json"].str.len() + frame["target_json"].str.len()
        ) // 4
    _write_set(examples, dataset_uri(settings), window)
    _write_set(rated, rated_uri(settings), window)
    by_split = examples.groupby("split").size().to_dict()
    return {k: int(v) for k, v in sorted(by_split.items())}, int((examples["context"] != "").sum())


def _clean(value: Any) -> Any:
    """Feast returns NaN for a missing float; the prompt treats it as absent."""
    return None if isinstance(value, float) and math.isnan(value) else value


def run_features(settings: Settings, window: DateWindow, spark: Any = None) -> FeaturesResult:
    started = time.perf_counter()
    with window_lock(settings, window):  # it rewrites the window's feature and training-set partitions
        customer_rows, category_rows = compute_features(settings, window, spark)
        views = feast_client.apply(settings)
        materialized = materialize_window(settings, window)
        by_split, with_context = build_training_set(settings, window)
        _record_in_manifest(settings, window, by_split, with_context)
    return FeaturesResult(
        window=str(window),
        customer_rows=customer_rows,
        category_rows=category_rows,
        feature_views=views,
        materialized_views=materialized,
        training_examples=by_split,
        with_context=with_context,
        dataset_uri=dataset_uri(settings),
        registry=str(redact_uri(settings.feast.registry)),
        online_store=str(redact_uri(settings.feast.online_store)),
        seconds=round(time.perf_counter() - started, 2),
    )


def _record_in_manifest(settings: Settings, window: DateWindow, by_split: dict[str, int], with_context: int) -> None:
    """Add the training set (with context) to the window's manifest: what train reads, and its digest."""
    manifests = zone_paths(settings)["manifests"]
    uri = f"{manifests}/{window.label}.json"
    manifest = read_json(uri)
    files, rated = (
        sorted(f for part in window_partitions(table, window.isoformat_days()) for f in glob(f"{part}/*.parquet"))
        for table in (dataset_uri(settings), rated_uri(settings))
    )
    manifest["training_set"] = {
        "uri": dataset_uri(settings),
        "examples_by_split": by_split,
        "with_customer_context": with_context,
        "files": files,
        "digest": _digest(files),
        "feature_refs": feast_client.customer_feature_refs(settings),
        "rated_files": rated,  # the window's rated rows with their prompts (KTO: `prep.thumbs`)
        "rated_digest": _digest(rated),
    }
    write_json(uri, manifest)
    _advance_current(settings, manifest)


def _digest(files: list[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(read_bytes(f))
    return h.hexdigest()


def _advance_current(settings: Settings, manifest: dict[str, Any]) -> None:
    """Point `curated/manifest.json` (what training, smoke tests and lineage read by default) at this
    window, unless a newer window's training set is already current: a backfill of an old window
    rebuilds that window's files and manifest but never moves "current" back in time. Under a lock,
    so two runs finishing at once cannot interleave their read and write."""
    current_uri = f"{settings.zone('curated')}/manifest.json"
    with shared_lock(current_uri, 120, "the current training set's manifest", settings.state_lock_uri):
        try:
            current = read_json(current_uri)
        except FileNotFoundError:
            current = {}
        now = current.get("window") or {}
        # newer end wins; on the same end the same or a longer window (a 1-day re-run does not replace
        # the 7-day training set ending that day)
        if (manifest["window"]["end"], _days(manifest["window"])) >= (now.get("end", ""), _days(now)):
            write_json(current_uri, manifest)


def _days(window: dict[str, str]) -> int:
    if not window.get("start"):
        return 0
    return len(DateWindow.parse(window["start"], window["end"]).days())


def online_context(customer_id: str, settings: Settings, store: Any = None) -> str:
    """The customer's context line from the online store (serving); same format as training."""
    return online_contexts([customer_id], settings, store).get(customer_id, "")


def online_contexts(customer_ids: list[str], settings: Settings, store: Any = None) -> dict[str, str]:
    """Each customer's context line from the online store, as the gateway serves it (one lookup for all;
    a customer the store does not know gets the empty line; a caller logged as `anonymous` none at all).
    `store`: a FeatureStore kept by a long-lived caller."""
    wanted = sorted({c for c in customer_ids if c and c != ANONYMOUS})
    if not wanted:
        return {}
    rows = feast_client.online_customer_features(settings, wanted, store)
    return {c: format_context(r) for c, r in zip(wanted, rows)}


def _snapshot_customers(settings: Settings) -> set[str]:
    """The customers the offline customer table has any snapshot of (its customer ids alone are read)."""
    import pyarrow.parquet as pq

    files = glob(f"{feature_paths(settings)['customer']}/dt=*/*.parquet")
    return {c for f in files for c in pq.read_table(f, columns=["customer_id"]).column(0).to_pylist() if c}


def point_in_time_contexts(settings: Settings, requests: Any) -> dict[str, str]:
    """Each request's customer context line as of its own time (`requests`: record_id, customer_id,
    event_timestamp): Feast's point-in-time join over the snapshots taken before it, the line training puts in a
    prompt and the line the online store served then (a later day's requests never show). Empty without any
    customer history (a customer with no snapshot at all, and a caller the gateway logged as `anonymous`, served
    without context, have none)."""
    if not has_offline_data(feature_paths(settings)["customer"]):
        return {}
    # a customer with no snapshot row at all has no context to join, and Feast's file store cannot sort a join that
    # holds one (its created timestamp null: "Divisions calculation failed"): asked only for customers it has
    customers = _snapshot_customers(settings) - {ANONYMOUS}
    known = requests[requests["customer_id"].isin(customers)]
    if known.empty:
        return {}
    joined = feast_client.historical_customer_features(settings, known)
    names = [r.split(":", 1)[1] for r in feast_client.customer_feature_refs(settings)]
    return {row["record_id"]: format_context({n: _clean(row[n]) for n in names}) for row in joined.to_dict("records")}
