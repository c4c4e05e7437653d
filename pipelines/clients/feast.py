"""Thin client for Feast: the store built from `Settings.feast`, apply, materialize, lookups.

`feast.registry` and `feast.online_store` are either files (the local profile: a registry file and
SQLite) or `postgresql://user:password@host:port/db` URIs (the cluster profile, RDS from terraform/):
then the registry is Feast's SQL registry and the online store its PostgreSQL store, both in that
database. The password comes from the environment with the URI, never from a file in the repo.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config import Settings

LOG = logging.getLogger("flywheel.feast")

if TYPE_CHECKING:
    import pandas as pd
    from feast import FeatureStore


def _no_import_time_type_instrumentation() -> None:
    """Feast decorates its classes with typeguard's `@typechecked`, which parses, rewrites and recompiles each
    decorated class's source when Feast is imported: 9 of the 14 s `import feast` took on this machine, in
    every process that imports it (each DAG run's features task, the gateway's online features). typeguard's
    own switch for production is `python -O` (the decorator is then the identity); -O cannot be used here (it
    strips asserts), so the decorator is made the identity before Feast is first imported. Nothing in Feast
    catches typeguard's errors; Feast's own checks (`apply`, its protobuf conversion) still run, and a test builds
    `feature_repo/features.py`'s definitions with typeguard's checks on. Only Feast imports typeguard among the
    platform's packages."""
    if "feast" in sys.modules:  # imported already: its classes are instrumented, nothing to save
        logging.getLogger(__name__).debug("feast was imported before its client: typeguard's checks stay on")
        return
    try:
        import typeguard
    except ImportError:  # no Feast installed here (a training image): nothing to do
        return

    def identity(target: Any = None, **_: Any) -> Any:
        return (lambda decorated: decorated) if target is None else target

    typeguard.typechecked = identity


_no_import_time_type_instrumentation()


def is_postgres(uri: str | None) -> bool:
    return str(uri).startswith(("postgresql://", "postgresql+"))


def _registry_config(registry: str) -> Any:
    from feast.repo_config import RegistryConfig

    if is_postgres(registry):  # Feast's SQL registry speaks SQLAlchemy: psycopg 3 is its driver here
        from feast.infra.registry.sql import SqlRegistryConfig

        rest = registry.split("://", 1)[1]
        return SqlRegistryConfig(
            registry_type="sql",
            path=f"postgresql+psycopg://{rest}",
            cache_ttl_seconds=0,
            sqlalchemy_config_kwargs={"echo": False, "pool_pre_ping": True},
        )
    Path(registry).parent.mkdir(parents=True, exist_ok=True)
    return RegistryConfig(path=registry, cache_ttl_seconds=0)


def _online_store_config(online_store: str, sslmode: str | None) -> Any:
    if not is_postgres(online_store):
        from feast.infra.online_stores.sqlite import SqliteOnlineStoreConfig

        return SqliteOnlineStoreConfig(path=online_store)
    from urllib.parse import unquote, urlsplit

    from feast.infra.online_stores.postgres_online_store.postgres import PostgreSQLOnlineStoreConfig

    uri = urlsplit(online_store.replace("postgresql+psycopg2://", "postgresql://"))
    return PostgreSQLOnlineStoreConfig(
        host=uri.hostname or "127.0.0.1",
        port=uri.port or 5432,
        database=uri.path.lstrip("/"),
        user=unquote(uri.username or ""),
        password=unquote(uri.password or ""),
        sslmode=sslmode,
    )


def feature_store(settings: Settings) -> FeatureStore:
    from feast import FeatureStore, RepoConfig
    from feast.infra.offline_stores.dask import DaskOfflineStoreConfig

    f = settings.feast
    config = RepoConfig(
        project=f.project,
        provider="local",
        registry=_registry_config(str(f.registry)),
        online_store=_online_store_config(str(f.online_store), f.sslmode),
        offline_store=DaskOfflineStoreConfig(),
        entity_key_serialization_version=3,
        repo_path=Path(f.repo_path),
    )
    return FeatureStore(config=config)


def close_store(store: Any) -> None:
    """Close what a FeatureStore holds open: its online store's connection (SQLite) or pool (PostgreSQL) and its
    SQL registry's engines. Feast has no synchronous close; each part is closed where it exists, best effort (a
    store already closed, or never connected, has nothing to close)."""
    provider = getattr(store, "_provider", None)
    online = getattr(provider, "_online_store", None)
    for name in ("_conn", "_conn_pool"):
        part = getattr(online, name, None) if online is not None else None
        if part is not None:
            try:
                part.close()
            except Exception:  # noqa: BLE001 (closing a broken connection)
                LOG.debug("feast online store %s not closed cleanly", name, exc_info=True)
            setattr(online, name, None)
    registry = getattr(store, "_registry", None)
    for name in ("write_engine", "read_engine"):
        engine = getattr(registry, name, None)
        if engine is not None and hasattr(engine, "dispose"):
            engine.dispose()


def definitions(settings: Settings) -> dict[str, Any]:
    """feature_repo/features.py's objects, with offline data read from this settings' features zone."""
    return _repo_module(settings.feast.repo_path).build(settings.zone("features"))


def apply(settings: Settings) -> list[str]:
    objects = list(definitions(settings).values())
    feature_store(settings).apply(objects)
    return [o.name for o in objects]


def materialize(settings: Settings, start: datetime, end: datetime, views: list[str] | None = None) -> None:
    feature_store(settings).materialize(start_date=start, end_date=end, feature_views=views)


def customer_feature_refs(settings: Settings) -> list[str]:
    """The customer view's features as Feast references, in the order the feature repository declares them
    (`feature_repo/features.py` is the one definition; read once per repository and zone)."""
    return list(_view_features(settings.feast.repo_path, settings.zone("features"), "customer_profile"))


def _repo_module(repo_path: str) -> Any:
    spec = importlib.util.spec_from_file_location("flywheel_feature_repo", Path(repo_path) / "features.py")
    if spec is None or spec.loader is None:  # a path ending in .py always has a source loader
        raise ImportError(f"cannot load the feature repository's features.py from {repo_path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@lru_cache(maxsize=16)
def _view_features(repo_path: str, features_zone: str, view: str) -> tuple[str, ...]:
    found = _repo_module(repo_path).build(features_zone)[view]
    return tuple(f"{view}:{field.name}" for field in found.features)


def online_customer_features(
    settings: Settings, customer_ids: list[str], store: FeatureStore | None = None
) -> list[dict[str, Any]]:
    """`store`: a FeatureStore kept by a long-lived caller (the gateway keeps one per thread: building one
    loads the registry, tens of milliseconds a request)."""
    refs = customer_feature_refs(settings)
    data = (
        (store or feature_store(settings))
        .get_online_features(features=refs, entity_rows=[{"customer_id": c} for c in customer_ids])
        .to_dict()
    )
    names = [r.split(":", 1)[1] for r in refs]
    return [{n: data[n][i] for n in names} for i in range(len(customer_ids))]


def historical_customer_features(settings: Settings, entity_df: pd.DataFrame) -> pd.DataFrame:
    """entity_df: customer_id, event_timestamp (+ any columns to carry); point-in-time join."""
    return (
        feature_store(settings)
        .get_historical_features(entity_df=entity_df, features=customer_feature_refs(settings))
        .to_df()
    )
