"""One typed settings object for every stage, service and DAG.

Two profiles share one schema: `local` fills in embedded defaults (everything under
`./.flywheel/`, SQLite, Spark `local[*]`, servers on 127.0.0.1); `cluster` expects the endpoints
that `terraform output` prints (Postgres URIs, `s3://` root, Spark master, Triton URL) and refuses
to start without them. Precedence, highest first: keyword arguments, `FLYWHEEL_*` environment
variables (nested with `__`, e.g. `FLYWHEEL_MLFLOW__PORT=5001`), the YAML file named by
`FLYWHEEL_CONFIG`, then the profile's defaults.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource

from pipelines.config_sections import (  # noqa: F401 (re-exported: one settings object, its sections in two files)
    LOOPBACK,
    BenchSettings,
    DriftSettings,
    EvaluationSettings,
    GatewaySettings,
    PromotionSettings,
    _Section,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROJECT = "default"
# a project name is a safe identifier: it becomes a folder, an S3 prefix, a Feast project, a Triton model prefix
PROJECT_PATTERN = r"^[a-z][a-z0-9_]{1,30}$"


class ConfigError(ValueError):
    """Configuration that cannot work; the message names the offending field."""


class AirflowSettings(_Section):
    home: str | None = None
    sql_alchemy_conn: str | None = None
    executor: Literal["LocalExecutor", "CeleryExecutor", "KubernetesExecutor"] = "LocalExecutor"
    host: str = LOOPBACK
    port: int = Field(8080, ge=1, le=65535)
    parallelism: int = Field(4, ge=1, le=512)
    dags_folder: str = str(REPO_ROOT / "dags")
    # `flywheel run`: how long one DAG run may take (dags test or the scheduler) before it is stopped
    run_timeout_s: float = Field(3600, gt=0)
    migrate_timeout_s: float = Field(300, gt=0)
    multi_team: bool | Literal["auto"] = Field(
        "auto",
        description="each AI project an Airflow team (Airflow 3.3's multi-team mode, experimental): its DAGs "
        "visible and triggerable only by its members' logins. auto: on while the platform has a project besides "
        "`default` (a single-team platform runs as before); true / false: always / never",
    )
    schedules: Literal["active", "paused"] = Field(
        "active",
        description="after `flywheel up`: the drift monitor (hourly) and the daily flywheel run on their "
        "schedules (active), or wait for `flywheel schedules resume` (paused)",
    )

    @field_validator("multi_team", mode="before")
    @classmethod
    def _multi_team(cls, value: Any) -> Any:
        words = {
            "auto": "auto",
            **dict.fromkeys(("true", "1", "on", "yes", "y", "t"), True),
            **dict.fromkeys(("false", "0", "off", "no", "n", "f"), False),
        }
        if isinstance(value, bool):
            return value
        if isinstance(value, (int, str)) and str(value).strip().lower() in words:
            return words[str(value).strip().lower()]
        raise ValueError("expected true, false or auto")


class MlflowSettings(_Section):
    tracking_uri: str | None = None
    backend_store_uri: str | None = None
    artifacts_destination: str | None = None
    host: str = LOOPBACK
    port: int = Field(5000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=32)
    experiment: str = "commerce-flywheel"
    registered_model: str = "commerce-tool-caller"
    auth: bool = Field(True, description="tracking server with basic authentication (mlflow/basic_auth.ini)")
    auth_database_uri: str | None = Field(
        None,
        description="the auth app's user store; default SQLite next to "
        "the tracking store (cluster: a PostgreSQL database)",
    )
    username: str | None = Field(None, description="client credentials for an authenticated tracking server")
    password: SecretStr | None = Field(None, description="client password; the server's admin password")
    server_secret_key: SecretStr | None = Field(
        None, description="the auth app's CSRF signing key (generated per root locally)"
    )


class SparkSettings(_Section):
    master: str | None = None
    app_name: str = "commerce-flywheel"
    # The case study's knobs: adaptive query execution, input split size, shuffle width.
    conf: dict[str, str] = Field(
        default_factory=lambda: {
            "spark.sql.adaptive.enabled": "true",
            "spark.sql.adaptive.coalescePartitions.enabled": "true",
            "spark.sql.files.maxPartitionBytes": "128m",
            "spark.sql.shuffle.partitions": "8",
            "spark.sql.session.timeZone": "UTC",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }
    )
    rapids: bool = False
    # Applied only when `rapids` is on (GPU clusters with the RAPIDS Accelerator jar).
    rapids_conf: dict[str, str] = Field(
        default_factory=lambda: {
            "spark.plugins": "com.nvidia.spark.SQLPlugin",
            "spark.rapids.sql.concurrentGpuTasks": "2",
            "spark.rapids.memory.pinnedPool.size": "2g",
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": "0.25",
        }
    )

    @field_validator("master")
    @classmethod
    def _known_master(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("local", "spark://", "k8s://", "yarn", "sc://")):
            raise ValueError("must be local[...], spark://host:port, k8s://..., yarn or sc://...")
        return value

    def effective_conf(self) -> dict[str, str]:
        return {**self.conf, **(self.rapids_conf if self.rapids else {})}


class FeastSettings(_Section):
    repo_path: str = str(REPO_ROOT / "feature_repo")
    project: str = "commerce_flywheel"
    registry: str | None = Field(None, description="registry file, or postgresql://... (Feast's SQL registry)")
    online_store: str | None = Field(None, description="SQLite file, or postgresql://... (PostgreSQL online store)")
    offline_store: Literal["file", "spark"] = "file"
    sslmode: str | None = Field(
        None,
        description="PostgreSQL online store: libpq sslmode; default "
        "`require` in the cluster profile (RDS forces TLS), `prefer` locally",
    )


class TritonSettings(_Section):
    host: str = LOOPBACK
    http_port: int = Field(8000, ge=1, le=65535)
    grpc_port: int = Field(8001, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)
    url: str | None = None
    model_repository: str | None = None
    model_name: str = Field(
        "tool_router",
        pattern=r"^[a-z][a-z0-9_]*$",
        description="Triton model name prefix; each registry version is <name>_v<N>",
    )
    execution_env: str | None = Field(
        None,
        description="the Python backend's environment (EXECUTION_ENV_PATH); "
        "default .venv-serve locally, none in a Triton container that has the packages",
    )
    instance_kind: Literal["KIND_CPU", "KIND_GPU"] = "KIND_CPU"
    max_batch_size: int = Field(8, ge=1, le=256)
    instances: int = Field(1, ge=1, le=64, description="model instances per Triton model (instance_group count)")
    threads: int = Field(
        1,
        ge=0,
        le=256,
        description="torch threads per CPU instance (0: torch's default, the "
        "cores). 1 measured best on this 2-core machine: as fast per token as 2 alone, and 2 threads "
        "stall 4-8x whenever anything else runs (a load generator, the gateway); README, serving",
    )
    queue_delay_us: int = Field(5000, ge=0, description="dynamic batching: how long a request waits for others")
    max_input_tokens: int | None = Field(
        None,
        ge=16,
        description="longest prompt a model accepts (tokens); "
        "unset: the base model's context window minus the model's answer budget "
        "(`toolcall.budget`); `flywheel bench` checks its prompts against it first",
    )
    max_new_tokens: int | None = Field(
        None,
        ge=8,
        description="longest answer a model writes (tokens); unset: the "
        "answer budget recorded with the model version (its longest training call "
        "plus a margin; 64 for a version registered without one)",
    )
    constrained: bool = Field(
        True,
        description="decode every served tool call under the offered tools' grammar "
        "(the client sends them as TOOLS): the smoke test, canary and `flywheel bench` use it",
    )
    grounded_ids: bool = Field(
        True,
        description="under the grammar, a write tool's `*_id`/`*_ids` arguments only "
        "take values the conversation states (served, evaluated and validated alike)",
    )
    multi_lora: bool = Field(
        False,
        description="serve every version (every project's) as an adapter on one loaded "
        "base per base model (`lora__<base>`), chosen per request, instead of one Triton model "
        "with its own copy of the base per version; local model repository only",
    )
    max_adapters: int = Field(
        8,
        ge=1,
        le=256,
        description="multi_lora: adapters the shared base keeps loaded; "
        "past it the least recently used one is unloaded (it loads again when asked)",
    )
    max_adapter_rank: int | None = Field(
        None,
        ge=1,
        le=512,
        description="multi_lora: the largest LoRA rank the "
        "shared base serves; a version over it is refused at deploy. Bounds the "
        "base's adapter memory at max_adapters x one adapter of this rank (unset: "
        "slots grow to the largest rank loaded and never shrink)",
    )
    smoke_requests: int = Field(6, ge=1, description="test-split requests a new deployment must answer first")
    smoke_min_valid_json: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of smoke answers that must parse "
        "as JSON, on top of every answer being well formed (no error, not empty), "
        "which the smoke test always requires; 0 only for untrained test models",
    )
    canary_share: float = Field(0.2, ge=0, le=1, description="share of replayed traffic sent to the candidate")
    startup_timeout_s: int = Field(120, ge=5)
    state_lock_timeout_s: float = Field(
        900,
        gt=0,
        description="how long deploy/rollback/canary wait for another "
        "one's lock on serving/state.json (a deploy's smoke test takes minutes)",
    )


class QualitySettings(_Section):
    """Great Expectations gate thresholds: per-record problems are quarantined by prep; a batch
    whose share of problems passes these limits stops the flywheel before training."""

    raw_mostly: float = Field(0.9, gt=0, le=1, description="share of raw lines that must pass each raw check")
    max_quarantined_share: float = Field(0.2, ge=0, le=1, description="largest share of a batch prep may quarantine")
    min_examples_per_tool: int = Field(5, ge=0)
    min_approx_tokens: int = Field(16, ge=0)
    max_approx_tokens: int | None = Field(
        None,
        ge=1,
        description="longest example (prep's approx_tokens); unset: "
        "the base model's context window minus the window's answer budget",
    )
    train_label_sources: list[Literal["teacher", "human", "import", "generated"]] = Field(
        default_factory=lambda: ["teacher", "human", "import", "generated"],
        description="label sources that train "
        "(prep.labels); our own models' answers train only when a person rated them up; a down-rated one never",
    )
    min_trusted_label_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="smallest share of a window's examples whose label our own model did not "
        "write (teacher, human, import, generated): the gate fails a window that would mostly retrain the champion "
        "on its own answers, even confirmed ones",
    )


class TrainSettings(_Section):
    """Where and how sweeps train; the sweep file holds the hyperparameters."""

    sweep: str = Field(str(REPO_ROOT / "conf" / "sweeps" / "demo.yaml"), description="default sweep file")
    drift_sweep: str | None = Field(
        str(REPO_ROOT / "conf" / "sweeps" / "drift.yaml"),
        description="the (smaller) sweep a drift-triggered retrain runs; None: `sweep`",
    )
    backend: Literal["hf", "nemo"] | None = Field(None, description="override the sweep file's backend")
    runner: Literal["local", "kubernetes"] = Field("local", description="local process, or one pod per variant")
    nemo_python: str = Field(
        str(REPO_ROOT / ".venv-nemo" / "bin" / "python"),
        description="interpreter of the NeMo AutoModel environment (make nemo-env)",
    )
    variant_timeout_s: float = Field(
        6 * 3600,
        gt=0,
        description="longest one variant's training process may run "
        "(NeMo AutoModel launch) before it is stopped; it resumes from its checkpoints",
    )


class KubernetesSettings(_Section):
    namespace: str = "flywheel"
    gpu_node_selector: dict[str, str] = Field(default_factory=lambda: {"flywheel.io/gpu": "h100"})
    nemo_image: str = Field("nvcr.io/nvidia/nemo-automodel:25.11", description="base of the training image")
    training_image: str = Field(
        "flywheel-training:latest",
        description="docker/training.Dockerfile, pushed to the registry from terraform output `training_image`",
    )
    triton_image: str = Field(
        "flywheel-triton:latest",
        description="docker/triton.Dockerfile: the official Triton image plus our Python backend's packages",
    )
    gateway_image: str = Field(
        "flywheel-platform:latest",
        description="an image with the `pipelines` package "
        "(the platform's requirements): the gateway runs `python -m pipelines.gateway`",
    )


class Settings(BaseSettings):
    """Everything configurable; `profile` decides the defaults of what is left unset."""

    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    profile: Literal["local", "cluster"] = "local"
    root: str | None = Field(None, description="Root of the data zones: a folder or an s3:// prefix")
    project: str = Field(
        DEFAULT_PROJECT,
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
    train: TrainSettings = Field(default_factory=TrainSettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    bench: BenchSettings = Field(default_factory=BenchSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    promotion: PromotionSettings = Field(default_factory=PromotionSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)
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
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
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


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings (cached); tests call `get_settings.cache_clear()` after changing env."""
    return load_settings()
