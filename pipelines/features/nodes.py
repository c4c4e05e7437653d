"""Feature computation (Spark): daily snapshots per customer and per product category.

A snapshot for day S summarises events of days S-29..S (and S-6..S) and is stamped at the start of
day S+1: everything in it happened strictly before that instant, so a point-in-time join can never
hand a training example a value computed from its own day or the future.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipelines.logs.tools import WORKLOADS
from pipelines.window import DateWindow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LONG_DAYS = 30
SHORT_DAYS = 7
CUSTOMER_FEATURES = [
    *(f"share_{w}_{SHORT_DAYS}d" for w in WORKLOADS),
    *(f"share_{w}_{LONG_DAYS}d" for w in WORKLOADS),
    "requests_30d",
    "order_count_30d",
    "avg_order_value_30d",
    "preferred_category",
    "last_country",
    "last_currency",
]
CATEGORY_FEATURES = ["query_volume_7d", "avg_price_asked_7d"]


def history_window(window: DateWindow) -> DateWindow:
    """Days of clean logs needed to compute the snapshots of `window`."""
    return DateWindow.ending(window.end, (window.end - window.start).days + LONG_DAYS)


def _snapshots(clean: DataFrame, window: DateWindow, horizon_days: int) -> DataFrame:
    from pyspark.sql import functions as F

    day = F.to_date("event_timestamp")
    first = F.greatest(day, F.lit(window.start.isoformat()).cast("date"))
    last = F.least(F.date_add(day, horizon_days - 1), F.lit(window.end.isoformat()).cast("date"))
    return clean.withColumn("snapshot", F.explode(F.sequence(first, last))).withColumn(
        "age", F.datediff("snapshot", day)
    )


def customer_features(clean: DataFrame, window: DateWindow) -> DataFrame:
    from pyspark.sql import functions as F

    rows = _snapshots(clean.filter(F.to_date("event_timestamp") <= F.lit(window.end.isoformat())), window, LONG_DAYS)
    short = F.col("age") < SHORT_DAYS
    n_short = F.sum(short.cast("int"))
    aggs = [
        # a customer seen only before the short horizon has no recent requests: share 0, not a division by 0
        *(
            F.coalesce(
                F.try_divide(F.sum((short & (F.col("workload_id") == w)).cast("int")), n_short), F.lit(0.0)
            ).alias(f"share_{w}_{SHORT_DAYS}d")
            for w in WORKLOADS
        ),
        *(F.avg((F.col("workload_id") == w).cast("double")).alias(f"share_{w}_{LONG_DAYS}d") for w in WORKLOADS),
        F.count("*").cast("long").alias("requests_30d"),
        F.sum((F.col("tool") == "create_order").cast("long")).alias("order_count_30d"),
        F.avg(F.when(F.col("tool").isin("capture_order", "create_invoice"), F.col("amount"))).alias(
            "avg_order_value_30d"
        ),
        F.max_by("country", "event_timestamp").alias("last_country"),
        F.max_by("currency", "event_timestamp").alias("last_currency"),
    ]
    base = rows.groupBy("customer_id", "snapshot").agg(*aggs)
    liked = (
        rows.filter(F.col("category").isNotNull())
        .groupBy("customer_id", "snapshot", "category")
        .agg(F.count("*").alias("n"))
        .groupBy("customer_id", "snapshot")
        .agg(F.max_by("category", F.struct("n", F.col("category"))).alias("preferred_category"))
    )
    return _stamp(base.join(liked, ["customer_id", "snapshot"], "left"))


def category_features(clean: DataFrame, window: DateWindow) -> DataFrame:
    from pyspark.sql import functions as F

    searches = clean.filter((F.col("tool") == "search_products") & F.col("category").isNotNull())
    rows = _snapshots(searches, window, SHORT_DAYS)
    agg = rows.groupBy("category", "snapshot").agg(
        F.count("*").cast("long").alias("query_volume_7d"), F.avg("price_asked").alias("avg_price_asked_7d")
    )
    return _stamp(agg)


def _stamp(frame: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (
        frame.withColumn("event_timestamp", F.to_utc_timestamp(F.date_add("snapshot", 1).cast("timestamp"), "UTC"))
        .withColumn("created_timestamp", F.current_timestamp())
        .withColumn("dt", F.col("snapshot").cast("string"))
        .drop("snapshot")
    )
