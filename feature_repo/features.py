"""Feast definitions: entities `customer` and `product_category` and their daily feature views.

The offline data is the Parquet written by `pipelines.features` (Spark) under the configured
features zone; the online store is filled by `flywheel features materialize`.
"""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.data_format import ParquetFormat
from feast.types import Float64, Int64, String

from pipelines.config import load_settings
from pipelines.logs.tools import WORKLOADS


def build(features_zone: str) -> dict[str, object]:
    """The repository's objects, reading offline data from `features_zone`."""
    customer = Entity(
        name="customer",
        join_keys=["customer_id"],
        value_type=ValueType.STRING,
        description="A shopper or merchant account",
    )
    product_category = Entity(
        name="product_category",
        join_keys=["category"],
        value_type=ValueType.STRING,
        description="A catalogue category (search filter value)",
    )
    customer_source = FileSource(
        name="customer_daily",
        path=f"{features_zone}/customer",
        file_format=ParquetFormat(),
        timestamp_field="event_timestamp",
        created_timestamp_column="created_timestamp",
    )
    category_source = FileSource(
        name="category_daily",
        path=f"{features_zone}/category",
        file_format=ParquetFormat(),
        timestamp_field="event_timestamp",
        created_timestamp_column="created_timestamp",
    )
    customer_profile = FeatureView(
        name="customer_profile",
        entities=[customer],
        ttl=timedelta(days=30),
        schema=[
            *(Field(name=f"share_{w}_{d}d", dtype=Float64) for d in (7, 30) for w in WORKLOADS),
            Field(name="requests_30d", dtype=Int64),
            Field(name="order_count_30d", dtype=Int64),
            Field(name="avg_order_value_30d", dtype=Float64),
            Field(name="preferred_category", dtype=String),
            Field(name="last_country", dtype=String),
            Field(name="last_currency", dtype=String),
        ],
        source=customer_source,
        online=True,
        description="Intent mix (7/30 days), orders, order value, preferred category, last market",
    )
    category_stats = FeatureView(
        name="category_stats",
        entities=[product_category],
        ttl=timedelta(days=7),
        schema=[Field(name="query_volume_7d", dtype=Int64), Field(name="avg_price_asked_7d", dtype=Float64)],
        source=category_source,
        online=True,
        description="Search volume and average price asked per category over 7 days",
    )
    prompt_context = FeatureService(name="prompt_context", features=[customer_profile])
    return {
        "customer": customer,
        "product_category": product_category,
        "customer_profile": customer_profile,
        "category_stats": category_stats,
        "prompt_context": prompt_context,
    }


# Module-level objects for the `feast` CLI (`feast apply` in this folder: an entry point, so its settings come
# from the configuration); the platform itself loads this file as `flywheel_feature_repo` and calls `build` with
# the features zone of the settings it was given.
if __name__ != "flywheel_feature_repo":
    globals().update(build(load_settings().zone("features")))
