"""Thin client for Feast: the store built from `Settings.feast`, apply, materialize, lookups."""

from __future__ import annotations

import importlib.util
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config import Settings

if TYPE_CHECKING:
    import pandas as pd
    from feast import FeatureStore


def feature_store(settings: Settings) -> FeatureStore:
    from feast import FeatureStore, RepoConfig
    from feast.infra.offline_stores.dask import DaskOfflineStoreConfig
    from feast.infra.online_stores.sqlite import SqliteOnlineStoreConfig
    from feast.repo_config import RegistryConfig

    f = settings.feast
    if settings.is_local:
        Path(str(f.registry)).parent.mkdir(parents=True, exist_ok=True)
    config = RepoConfig(
        project=f.project,
        provider="local",
        registry=RegistryConfig(path=str(f.registry), cache_ttl_seconds=0),
        online_store=SqliteOnlineStoreConfig(path=str(f.online_store)),
        offline_store=DaskOfflineStoreConfig(),
        entity_key_serialization_version=3,
        repo_path=Path(f.repo_path),
    )
    return FeatureStore(config=config)


def definitions(settings: Settings) -> dict[str, Any]:
    """feature_repo/features.py's objects, with offline data read from this settings' features zone."""
    path = Path(settings.feast.repo_path) / "features.py"
    spec = importlib.util.spec_from_file_location("flywheel_feature_repo", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(settings.zone("features"))


def apply(settings: Settings) -> list[str]:
    objects = list(definitions(settings).values())
    feature_store(settings).apply(objects)
    return [o.name for o in objects]


def materialize(settings: Settings, start: datetime, end: datetime) -> None:
    feature_store(settings).materialize(start_date=start, end_date=end)


def customer_feature_refs(settings: Settings) -> list[str]:
    from pipelines.features.nodes import CUSTOMER_FEATURES

    return [f"customer_profile:{name}" for name in CUSTOMER_FEATURES]


def online_customer_features(settings: Settings, customer_ids: list[str]) -> list[dict[str, Any]]:
    refs = customer_feature_refs(settings)
    data = feature_store(settings).get_online_features(
        features=refs, entity_rows=[{"customer_id": c} for c in customer_ids]).to_dict()
    names = [r.split(":", 1)[1] for r in refs]
    return [{n: data[n][i] for n in names} for i in range(len(customer_ids))]


def historical_customer_features(settings: Settings, entity_df: pd.DataFrame) -> pd.DataFrame:
    """entity_df: customer_id, event_timestamp (+ any columns to carry); point-in-time join."""
    return feature_store(settings).get_historical_features(
        entity_df=entity_df, features=customer_feature_refs(settings)).to_df()
