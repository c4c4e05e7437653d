"""The settings of the systems the platform runs on: Airflow, MLflow, Spark, Feast, Triton and Kubernetes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from pipelines.config.base import LOOPBACK, REPO_ROOT, _Section


class AirflowSettings(_Section):
    """Airflow: where it keeps its state, how it runs tasks, and how long a run may take."""

    home: str | None = Field(
        default=None,
        description="AIRFLOW_HOME: Airflow's configuration, logs and (locally) its SQLite metadata database; default "
        "<root>/airflow",
    )
    sql_alchemy_conn: str | None = Field(
        default=None,
        description="Airflow's metadata database; default SQLite under airflow.home (the cluster profile needs "
        "postgresql://)",
    )
    executor: Literal["LocalExecutor", "CeleryExecutor", "KubernetesExecutor"] = Field(
        default="LocalExecutor",
        description="how Airflow runs tasks: LocalExecutor on one machine, CeleryExecutor or KubernetesExecutor on a "
        "cluster",
    )
    host: str = Field(
        default=LOOPBACK,
        description="the address the Airflow API server binds (the local profile allows 127.0.0.1 only)",
    )
    port: int = Field(default=8080, ge=1, le=65535, description="the Airflow API server's port (UI and REST API)")
    parallelism: int = Field(
        default=4,
        ge=1,
        le=512,
        description="task instances Airflow runs at once (each forks a process: keep it small on a laptop)",
    )
    dags_folder: str = Field(
        default=str(REPO_ROOT / "dags"), description="where Airflow reads the DAG files (this repository's dags/)"
    )
    # `flywheel run`: how long one DAG run may take (dags test or the scheduler) before it is stopped
    run_timeout_s: float = Field(
        default=3600,
        gt=0,
        description="`flywheel run` and `make demo`: how long one DAG run may take before it is stopped (it resumes "
        "when run again)",
    )
    migrate_timeout_s: float = Field(
        default=300, gt=0, description="the longest `airflow db migrate` may take before a run gives up"
    )
    multi_team: bool | Literal["auto"] = Field(
        default="auto",
        description="each AI project an Airflow team (Airflow 3.3's multi-team mode, experimental): its DAGs "
        "visible and triggerable only by its members' logins. auto: on while the platform has a project besides "
        "`default` (a single-team platform runs as before); true / false: always / never",
    )
    schedules: Literal["active", "paused"] = Field(
        default="active",
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
    """MLflow: the tracking server and registry every run, evaluation and model version lives in."""

    tracking_uri: str | None = Field(
        default=None,
        description="where clients log runs and models: the tracking server's URL (default: the local store itself, "
        "or the local server once `flywheel up` runs)",
    )
    backend_store_uri: str | None = Field(
        default=None,
        description="the tracking server's store of runs and the registry; default SQLite under <root>/runs (the "
        "cluster profile needs postgresql://)",
    )
    artifacts_destination: str | None = Field(
        default=None,
        description="where the server keeps artifacts (adapters, reports); default <root>/runs/artifacts, s3://... on "
        "a cluster",
    )
    host: str = Field(
        default=LOOPBACK,
        description="the address the local tracking server binds (127.0.0.1 only in the local profile)",
    )
    port: int = Field(default=5000, ge=1, le=65535, description="the local tracking server's port (UI and REST API)")
    workers: int = Field(default=1, ge=1, le=32, description="the tracking server's worker processes")
    experiment: str = Field(
        default="commerce-flywheel",
        description="the experiment sweeps log into (a project's is `<experiment>--<project>`)",
    )
    registered_model: str = Field(
        default="commerce-tool-caller",
        description="the registered model whose versions are the tuned adapters (a project's is `<name>--<project>`)",
    )
    auth: bool = Field(default=True, description="tracking server with basic authentication (mlflow/basic_auth.ini)")
    auth_database_uri: str | None = Field(
        default=None,
        description="the auth app's user store; default SQLite next to "
        "the tracking store (cluster: a PostgreSQL database)",
    )
    username: str | None = Field(default=None, description="client credentials for an authenticated tracking server")
    password: SecretStr | None = Field(default=None, description="client password; the server's admin password")
    server_secret_key: SecretStr | None = Field(
        default=None, description="the auth app's CSRF signing key (generated per root locally)"
    )


class SparkSettings(_Section):
    """Spark: the engine prep runs on (local threads here, a cluster master in the cluster profile)."""

    master: str | None = Field(
        default=None,
        description="Spark's master for prep: local[*] by default, spark://host:port, k8s://..., yarn or sc:// (Spark "
        "Connect)",
    )
    app_name: str = Field(default="commerce-flywheel", description="the Spark application's name (its UI and logs)")
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
        },
        description="Spark configuration applied to every session: adaptive query execution, input split size, "
        "shuffle width, UTC time zone",
    )
    rapids: bool = Field(
        default=False,
        description="run prep on GPUs with the RAPIDS Accelerator (a GPU cluster with its jar); applies rapids_conf",
    )
    # Applied only when `rapids` is on (GPU clusters with the RAPIDS Accelerator jar).
    rapids_conf: dict[str, str] = Field(
        default_factory=lambda: {
            "spark.plugins": "com.nvidia.spark.SQLPlugin",
            "spark.rapids.sql.concurrentGpuTasks": "2",
            "spark.rapids.memory.pinnedPool.size": "2g",
            "spark.executor.resource.gpu.amount": "1",
            "spark.task.resource.gpu.amount": "0.25",
        },
        description="the RAPIDS Accelerator's configuration, applied only when `rapids` is on",
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
    """Feast: the feature repository, its registry and online store (the customer context of a prompt)."""

    repo_path: str = Field(
        default=str(REPO_ROOT / "feature_repo"),
        description="the Feast feature repository (this repository's feature_repo/)",
    )
    project: str = Field(
        default="commerce_flywheel", description="the Feast project name (a platform project's is `<project>__<name>`)"
    )
    registry: str | None = Field(default=None, description="registry file, or postgresql://... (Feast's SQL registry)")
    online_store: str | None = Field(
        default=None, description="SQLite file, or postgresql://... (PostgreSQL online store)"
    )
    offline_store: Literal["file", "spark"] = Field(
        default="file", description="where historical features are computed: `file` (parquet, pandas) or `spark`"
    )
    sslmode: str | None = Field(
        default=None,
        description="PostgreSQL online store: libpq sslmode; default "
        "`require` in the cluster profile (RDS forces TLS), `prefer` locally",
    )


class TritonSettings(_Section):
    """Triton: the server that serves every model version, how it batches, and how served answers are decoded."""

    host: str = Field(
        default=LOOPBACK, description="the address the local Triton server binds (127.0.0.1 only in the local profile)"
    )
    http_port: int = Field(
        default=8000, ge=1, le=65535, description="Triton's HTTP port (model control, health, inference)"
    )
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton's gRPC port (streamed inference)")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton's Prometheus metrics port")
    url: str | None = Field(
        default=None,
        description="where clients reach Triton (host:http_port); the cluster profile needs the Service's address",
    )
    model_repository: str | None = Field(
        default=None,
        description="the Triton model repository deploys write to; default <root>/serving/model_repository (s3://... "
        "on a cluster)",
    )
    model_name: str = Field(
        default="tool_router",
        pattern=r"^[a-z][a-z0-9_]*$",
        description="Triton model name prefix; each registry version is <name>_v<N>",
    )
    execution_env: str | None = Field(
        default=None,
        description="the Python backend's environment (EXECUTION_ENV_PATH); "
        "default .venv-serve locally, none in a Triton container that has the packages",
    )
    instance_kind: Literal["KIND_CPU", "KIND_GPU"] = Field(
        default="KIND_CPU", description="where each model instance runs: KIND_CPU or KIND_GPU"
    )
    max_batch_size: int = Field(
        default=8, ge=1, le=256, description="the largest dynamic batch Triton forms for one model"
    )
    instances: int = Field(
        default=1, ge=1, le=64, description="model instances per Triton model (instance_group count)"
    )
    threads: int = Field(
        default=1,
        ge=0,
        le=256,
        description="torch threads per CPU instance (0: torch's default, the cores). The default, 1, is the "
        "measured choice on a 2-core machine, where more threads stall whenever anything else runs beside the "
        "model (a load generator, the gateway): the benchmarks page has the figures",
    )
    queue_delay_us: int = Field(default=5000, ge=0, description="dynamic batching: how long a request waits for others")
    precision: Literal["fp32", "bf16", "auto"] = Field(
        default="bf16",
        description="what a CPU instance computes in: fp32, bf16 (every step), or auto (an fp32 and a bf16 copy of "
        "the merged model; a batch of at least bf16_min_rows requests runs in bf16; a shared base serves auto as "
        "fp32). A GPU instance serves bf16 either way. The default is the measured choice on a CPU with AMX "
        "(`bench/serve_precision.py`, i.e. `flywheel bench --precisions fp32,bf16,auto`; the benchmarks page has "
        "the figures); a CPU without bf16 units (AVX-512 BF16 or AMX) serves fp32 whatever this says. Evaluation, the "
        "sweep's validation and the episodes run decode at the precision this serves one request at",
    )
    bf16_min_rows: int = Field(
        default=4, ge=1, le=256, description="precision auto: the smallest batch that runs on the bf16 copy"
    )
    max_input_tokens: int | None = Field(
        default=None,
        ge=16,
        description="longest prompt a model accepts (tokens); "
        "unset: the base model's context window minus the model's answer budget "
        "(`toolcall.budget`); `flywheel bench` checks its prompts against it first",
    )
    max_new_tokens: int | None = Field(
        default=None,
        ge=8,
        description="longest answer a model writes (tokens); unset: the "
        "answer budget recorded with the model version (its longest training call "
        "plus a margin; 64 for a version registered without one)",
    )
    constrained: bool = Field(
        default=True,
        description="decode every served tool call under the offered tools' grammar "
        "(the client sends them as TOOLS): the smoke test, canary and `flywheel bench` use it",
    )
    grounded_ids: bool = Field(
        default=True,
        description="under the grammar, a write tool's `*_id`/`*_ids` arguments only "
        "take values the conversation states (served, evaluated and validated alike)",
    )
    multi_lora: bool = Field(
        default=False,
        description="serve every version (every project's) as an adapter on one loaded "
        "base per base model (`lora__<base>`), chosen per request, instead of one Triton model "
        "with its own copy of the base per version; local model repository only",
    )
    max_adapters: int = Field(
        default=8,
        ge=1,
        le=256,
        description="multi_lora: adapters the shared base keeps loaded; "
        "past it the least recently used one is unloaded (it loads again when asked)",
    )
    max_adapter_rank: int | None = Field(
        default=None,
        ge=1,
        le=512,
        description="multi_lora: the largest LoRA rank the "
        "shared base serves; a version over it is refused at deploy. Bounds the "
        "base's adapter memory at max_adapters x one adapter of this rank (unset: "
        "slots grow to the largest rank loaded and never shrink)",
    )
    smoke_requests: int = Field(default=6, ge=1, description="test-split requests a new deployment must answer first")
    smoke_min_valid_json: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="share of smoke answers that must parse "
        "as JSON, on top of every answer being well formed (no error, not empty), "
        "which the smoke test always requires; 0 only for untrained test models",
    )
    canary_share: float = Field(default=0.2, ge=0, le=1, description="share of replayed traffic sent to the candidate")
    startup_timeout_s: int = Field(
        default=120, ge=5, description="how long `flywheel serve up` waits for Triton to answer its health check"
    )
    state_lock_timeout_s: float = Field(
        default=900,
        gt=0,
        description="how long deploy/rollback/canary wait for another "
        "one's lock on serving/state.json (a deploy's smoke test takes minutes)",
    )


class KubernetesSettings(_Section):
    """Kubernetes: the namespace, node selection and images of the manifests the platform writes."""

    namespace: str = Field(default="flywheel", description="the namespace every manifest the platform writes lives in")
    gpu_node_selector: dict[str, str] = Field(
        default_factory=lambda: {"flywheel.io/gpu": "h100"},
        description="the node labels training pods and Triton are scheduled onto (the GPU node group)",
    )
    nemo_image: str = Field(default="nvcr.io/nvidia/nemo-automodel:25.11", description="base of the training image")
    nemo_rl_image: str = Field(
        default="nvcr.io/nvidia/nemo-rl:v0.6.0",
        description="NVIDIA NeMo RL's container: the tune stage's DPO and GRPO on GPUs (`flywheel tune export`)",
    )
    training_image: str = Field(
        default="flywheel-training:latest",
        description="docker/training.Dockerfile, pushed to the registry from terraform output `training_image`",
    )
    triton_image: str = Field(
        default="flywheel-triton:latest",
        description="docker/triton.Dockerfile: the official Triton image plus our Python backend's packages",
    )
    gateway_image: str = Field(
        default="flywheel-platform:latest",
        description="an image with the `pipelines` package "
        "(the platform's requirements): the gateway runs `python -m pipelines.gateway`",
    )
