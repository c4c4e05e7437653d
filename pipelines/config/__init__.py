"""One typed settings object for every stage, service and DAG.

Two profiles share one schema: `local` fills in embedded defaults (everything under
`./.flywheel/`, SQLite, Spark `local[*]`, servers on 127.0.0.1); `cluster` expects the endpoints
that `terraform output` prints (Postgres URIs, `s3://` root, Spark master, Triton URL) and refuses
to start without them. Precedence, highest first: keyword arguments, `FLYWHEEL_*` environment
variables (nested with `__`, e.g. `FLYWHEEL_MLFLOW__PORT=5001`), the YAML file named by
`FLYWHEEL_CONFIG`, then the profile's defaults.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from pipelines.config.base import LOOPBACK, REPO_ROOT, ConfigError, _Section  # noqa: F401 (the public surface)
from pipelines.config.gateway import GatewaySettings  # noqa: F401 (the public surface)
from pipelines.config.stages import (  # noqa: F401 (the public surface)
    DECODINGS,
    BenchSettings,
    DriftSettings,
    EpisodeSettings,
    EvaluationSettings,
    PromotionSettings,
    QualitySettings,
    TrainSettings,
    decoding_modes,
)
from pipelines.config.systems import (  # noqa: F401 (the public surface)
    AirflowSettings,
    FeastSettings,
    KubernetesSettings,
    MlflowSettings,
    SparkSettings,
    TritonSettings,
)
from pipelines.config.tune import TuneSettings  # noqa: F401 (the public surface)

DEFAULT_PROJECT = "default"
# a project name is a safe identifier: it becomes a folder, an S3 prefix, a Feast project, a Triton model prefix
PROJECT_PATTERN = r"^[a-z][a-z0-9_]{1,30}$"


# older variables that still set a field, below FLYWHEEL_<SECTION>__<FIELD> in precedence: section, field, parser
LEGACY_ENV: dict[str, tuple[str, str, Callable[[str], Any]]] = {
    "FLYWHEEL_HARDWARE_JSON": ("bench", "hardware", json.loads),
    "FLYWHEEL_AIPERF": ("bench", "aiperf", str),
}


def _legacy_env_source(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource:
    values: dict[str, dict[str, Any]] = {}
    for name, (section, field, parse) in LEGACY_ENV.items():
        raw = os.environ.get(name)
        if raw:
            try:
                values.setdefault(section, {})[field] = parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
    return InitSettingsSource(settings_cls, init_kwargs=values)


class Settings(BaseSettings):
    """Everything configurable; `profile` decides the defaults of what is left unset."""

    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    profile: Literal["local", "cluster"] = Field(
        default="local",
        description="which defaults fill what is left unset: `local` (embedded, everything under the root on this "
        "machine) or `cluster` (the endpoints `terraform output` prints; refuses to start without them)",
    )
    root: str | None = Field(default=None, description="Root of the data zones: a folder or an s3:// prefix")
    project: str = Field(
        default=DEFAULT_PROJECT,
        pattern=PROJECT_PATTERN,
        description="the AI project every command and "
        "run works in (`flywheel --project NAME`, FLYWHEEL_PROJECT): its zones live under "
        "<root>/projects/<name>/, its experiment, registered model, Feast project and Triton models "
        "carry its name; `default` is the single-team layout (zones right under the root)",
    )
    airflow: AirflowSettings = Field(default_factory=AirflowSettings)
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)
    feast: FeastSettings = Field(default_factory=FeastSettings)
    triton: TritonSettings = Field(default_factory=TritonSettings)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    state_lock_uri: str | None = Field(
        default=None,
        description="the PostgreSQL database whose advisory locks guard state shared between hosts (the serving "
        "state, the gateway routes, the project registry on object storage); default in the cluster profile: "
        "airflow.sql_alchemy_conn. Local state: a file lock",
    )
    train: TrainSettings = Field(default_factory=TrainSettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    episodes: EpisodeSettings = Field(default_factory=EpisodeSettings)
    bench: BenchSettings = Field(default_factory=BenchSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    promotion: PromotionSettings = Field(default_factory=PromotionSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)
    tune: TuneSettings = Field(default_factory=TuneSettings)
    _unscoped: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)  # the names before a project's

    def unscoped_dump(self) -> dict[str, Any]:
        """These settings as keyword arguments, with the names a project scoped back to the platform's own
        (what `pipelines.projects.settings_for` rebuilds another project's settings from)."""
        data = self.model_dump(mode="python")
        for section, values in self._unscoped.items():
            data[section].update(values)
        return data

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, _legacy_env_source(settings_cls)]
        yaml_file = os.environ.get("FLYWHEEL_CONFIG")
        if yaml_file:
            if not Path(yaml_file).is_file():
                raise ConfigError(f"FLYWHEEL_CONFIG: no such file: {yaml_file}")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)

    @model_validator(mode="after")
    def _fill_profile_defaults(self) -> Settings:
        if self.profile == "local":
            self._fill_local()
        else:
            self._check_cluster()
        self._scope_to_project()
        return self

    def _scope_to_project(self) -> None:
        """What a project owns carries its name; what the platform shares (the servers, their stores, the
        Triton model repository, the base models) stays where it is. `default` changes nothing."""
        name = self.project
        if name == DEFAULT_PROJECT:
            return
        m, f, t = self.mlflow, self.feast, self.triton
        self._unscoped.update(
            {
                "mlflow": {"experiment": m.experiment, "registered_model": m.registered_model},
                "feast": {"project": f.project, "registry": f.registry, "online_store": f.online_store},
                "triton": {"model_name": t.model_name},
            }
        )
        m.experiment = f"{m.experiment}--{name}"
        m.registered_model = f"{m.registered_model}--{name}"
        f.project = f"{f.project}__{name}"
        t.model_name = f"{name}__{t.model_name}"
        if self.is_local:  # a file per project; the cluster's SQL registry and online store key by project name
            f.registry = str(Path(self.project_root()) / "features" / "registry.db")
            f.online_store = str(Path(self.project_root()) / "features" / "online_store.db")

    def _fill_local(self) -> None:
        root = Path(self.root or os.environ.get("FLYWHEEL_HOME") or Path.cwd() / ".flywheel").resolve()
        object.__setattr__(self, "root", str(root))
        a, m, s, f, t = self.airflow, self.mlflow, self.spark, self.feast, self.triton
        a.home = a.home or str(root / "airflow")
        a.sql_alchemy_conn = a.sql_alchemy_conn or f"sqlite:///{root / 'airflow' / 'airflow.db'}"
        m.backend_store_uri = m.backend_store_uri or f"sqlite:///{root / 'runs' / 'mlflow.db'}"
        m.artifacts_destination = m.artifacts_destination or str(root / "runs" / "artifacts")
        m.tracking_uri = m.tracking_uri or m.backend_store_uri
        s.master = s.master or "local[*]"
        f.registry = f.registry or str(root / "features" / "registry.db")
        f.online_store = f.online_store or str(root / "features" / "online_store.db")
        f.sslmode = f.sslmode or "prefer"
        t.url = t.url or f"{t.host}:{t.http_port}"
        t.model_repository = t.model_repository or str(root / "serving" / "model_repository")
        t.execution_env = t.execution_env or str(REPO_ROOT / ".venv-serve")
        for section, name in ((a, "airflow"), (m, "mlflow"), (t, "triton"), (self.gateway, "gateway")):
            if section.host != LOOPBACK:
                raise ValueError(f"{name}.host: the local profile binds servers to {LOOPBACK} only")

    def _check_cluster(self) -> None:
        required = {
            "root": self.root,
            "airflow.sql_alchemy_conn": self.airflow.sql_alchemy_conn,
            "mlflow.tracking_uri": self.mlflow.tracking_uri,
            "mlflow.backend_store_uri": self.mlflow.backend_store_uri,
            "mlflow.artifacts_destination": self.mlflow.artifacts_destination,
            "spark.master": self.spark.master,
            "triton.url": self.triton.url,
            "triton.model_repository": self.triton.model_repository,
            "feast.registry": self.feast.registry,
            "feast.online_store": self.feast.online_store,
        }
        self.feast.sslmode = self.feast.sslmode or "require"
        if self.state_lock_uri is None:
            object.__setattr__(self, "state_lock_uri", self.airflow.sql_alchemy_conn)
        missing = [name for name, value in required.items() if not value]
        if missing:
            raise ValueError(f"{missing[0]}: required by the cluster profile (see terraform output)")
        if not str(self.root).startswith(("s3://", "s3a://", "gs://", "abfss://")):
            raise ValueError("root: the cluster profile needs an object-store URI such as s3://bucket/flywheel")
        for name, uri in (
            ("airflow.sql_alchemy_conn", self.airflow.sql_alchemy_conn),
            ("mlflow.backend_store_uri", self.mlflow.backend_store_uri),
        ):
            if not str(uri).startswith("postgresql"):
                raise ValueError(f"{name}: the cluster profile needs a postgresql:// URI")

    # Data zones (../shared/DESIGN.md): one place that knows where each lives.
    def project_root(self) -> str:
        """Where this project's zones live: the root itself for `default`, else <root>/projects/<name>."""
        root = str(self.root).rstrip("/")
        return root if self.project == DEFAULT_PROJECT else f"{root}/projects/{self.project}"

    def zone(self, name: Literal["raw", "quarantine", "curated", "features", "runs", "serving", "reports"]) -> str:
        return f"{self.project_root()}/{name}"

    @property
    def is_local(self) -> bool:
        return self.profile == "local"


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "settings"
    message = first["msg"].removeprefix("Value error, ")
    if field == "settings" and ":" in message:
        return message
    got = first.get("input")
    hint = f" (got {got!r})" if got is not None and not isinstance(got, dict) else ""
    return f"{field}: {message}{hint}"


def load_settings(**overrides: Any) -> Settings:
    """Build settings from all sources; raise ConfigError whose message names the bad field."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(f"invalid configuration: {_describe(exc)}") from None
