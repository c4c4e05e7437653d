"""The settings of the systems the platform runs on: Airflow, MLflow, Spark, Feast, Triton and Kubernetes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from pipelines.config.base import LOOPBACK, REPO_ROOT, _Section


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
