"""One Kubernetes pod per sweep variant on the GPU node group (the `kubernetes` train runner).

The DAG's `train_pods` task calls `sweep_pods` for the plan, and a mapped KubernetesPodOperator
(`train_variant`) runs each pod; the `train` task then collects the variants from MLflow and picks
the best, exactly as after a local sweep. Each pod runs `python -m pipelines.train.pod` in the
training image (our package on top of the NeMo AutoModel container: `docker/training.Dockerfile`),
which trains its one variant with the sweep's backend (`nemo`: `torchrun`, one process per GPU,
the recipe generated in the pod) and logs it as the sweep's child run, adapter included.

It lands on the GPU pool through the node selector and the `nvidia.com/gpu` toleration that
`terraform/modules/eks` sets, requests whole GPUs, runs as the `training` service account (IRSA:
read curated data, write MLflow artifacts) and as non-root. No secret is in the spec: the
non-secret settings come from the `flywheel-settings` ConfigMap, database URIs and the MLflow
password from the `flywheel-secrets` Secret (both written by the cluster deployment, see README).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, SecretStr

from pipelines.config import Settings

SETTINGS_CONFIG_MAP = "flywheel-settings"
# sections the pods need only a few fields of (the validation decodes as the evaluation does)
POD_ONLY = {"evaluation": {"max_new_tokens", "constrained"}}
SECRETS = "flywheel-secrets"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def gpu_pod_spec(k: Any) -> dict[str, Any]:
    """What every training pod's spec shares: run once, as the `training` service account, on the GPU pool, as
    non-root (`k`: the kubernetes settings)."""
    return {
        "restartPolicy": "Never",
        "serviceAccountName": "training",
        "nodeSelector": dict(k.gpu_node_selector),
        "tolerations": [dict(GPU_TOLERATION)],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
    }


def pod_name(sweep_id: str, index: int) -> str:
    """A DNS-1123 name, stable per variant (the operator adds a suffix per try)."""
    name = re.sub(r"[^a-z0-9-]", "-", f"train-{sweep_id}-{index:02d}".lower())
    return name[:63].rstrip("-")


def variant_pod(
    settings: Settings,
    *,
    sweep: dict[str, Any],
    sweep_id: str,
    index: int,
    gpus: int,
    reference_days: list[str] | None = None,
    window: str | None = None,
) -> dict[str, Any]:
    """The pod manifest (a plain dict: `kubectl apply -f`, or the operator's `pod_template_dict`)."""
    k = settings.kubernetes
    command = [
        "python",
        "-m",
        "pipelines.train.pod",
        "--sweep-json",
        json.dumps(sweep, sort_keys=True),
        "--index",
        str(index),
    ]
    if reference_days:
        command += ["--reference-days", ",".join(reference_days)]
    if window:  # the training set's window: every pod trains on the one the plan resolved
        command += ["--window", window]
    command += ["--project", settings.project]  # its project's data and runs
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(sweep_id, index),
            "namespace": k.namespace,
            "labels": {
                "app.kubernetes.io/part-of": "commerce-flywheel",
                "flywheel.io/sweep": re.sub(r"[^A-Za-z0-9_.-]", "-", sweep_id)[:63].strip("-_."),
                "flywheel.io/variant": str(index),
            },
        },
        "spec": {
            **gpu_pod_spec(k),
            "containers": [
                {
                    "name": "base",  # the name KubernetesPodOperator streams logs from
                    "image": k.training_image,
                    "command": command,
                    "envFrom": [{"configMapRef": {"name": SETTINGS_CONFIG_MAP}}, {"secretRef": {"name": SECRETS}}],
                    "env": [
                        {"name": "FLYWHEEL_TRAIN__RUNNER", "value": "local"},  # the pod trains its variant itself
                        {"name": "FLYWHEEL_TRAIN__NEMO_PYTHON", "value": "python"},  # the image is NeMo's
                    ],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [
                        {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 (the pod's memory-backed volume)
                        {"name": "work", "mountPath": "/work"},
                    ],
                    "workingDir": "/work",
                }
            ],
            "volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
                {"name": "work", "emptyDir": {}},
            ],
        },
    }


NEMO_RL_SCRIPTS = {"dpo": "examples/run_dpo.py", "grpo": "examples/run_grpo.py"}


# the init container copies the export (a runs-zone folder: S3 on a cluster) into the pod, with the training image's
# fsspec and the `training` service account's access; NeMo RL's container needs no access of its own
FETCH = (
    "import sys, fsspec; fs, path = fsspec.core.url_to_fs(sys.argv[1]); "
    "fs.get(path.rstrip('/') + '/', '/export/', recursive=True)"
)


def nemo_rl_pod(settings: Settings, *, method: str, export_uri: str, run_name: str, gpus: int) -> dict[str, Any]:
    """The pod that runs a `flywheel tune export` folder's method with NeMo RL on the GPU pool: the export copied
    in by an init container, NeMo RL's container reading its overrides as the config, no secret in the spec."""
    if method not in NEMO_RL_SCRIPTS:
        raise ValueError(f"method: expected one of {sorted(NEMO_RL_SCRIPTS)}, got {method!r}")
    k = settings.kubernetes
    name = re.sub(r"[^a-z0-9-]", "-", f"tune-{method}-{run_name}".lower())[:63].rstrip("-")
    command = ["uv", "run", NEMO_RL_SCRIPTS[method], "--config", f"/export/{method}_config.yaml",
               f"cluster.gpus_per_node={gpus}", f"checkpointing.checkpoint_dir=/work/{run_name}"]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": k.namespace,
            "labels": {"app.kubernetes.io/part-of": "commerce-flywheel", "flywheel.io/tune": method},
        },
        "spec": {
            **gpu_pod_spec(k),
            "initContainers": [
                {
                    "name": "fetch-export",
                    "image": k.training_image,
                    "command": ["python", "-c", FETCH, export_uri],
                    "envFrom": [{"configMapRef": {"name": SETTINGS_CONFIG_MAP}}],
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [{"name": "export", "mountPath": "/export"}],
                }
            ],
            "containers": [
                {
                    "name": "base",
                    "image": k.nemo_rl_image,
                    "command": command,  # reads only the export: no settings or secrets of the platform
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [
                        {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 (the pod's memory-backed volume)
                        {"name": "export", "mountPath": "/export", "readOnly": True},
                        {"name": "work", "mountPath": "/work"},
                    ],
                    "workingDir": "/opt/nemo-rl",
                }
            ],
            "volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}},
                {"name": "export", "emptyDir": {}},
                {"name": "work", "emptyDir": {}},
            ],
        },
    }


ENDPOINTS = ("mlflow", "spark", "feast", "triton", "evaluation")  # every value: the cluster profile fills them in


def sections(settings: Settings) -> list[str]:
    """The settings' sections (mlflow, gateway, train, ...), in their declared order."""
    return [name for name in type(settings).model_fields if isinstance(getattr(settings, name), BaseModel)]


def settings_config_map(settings: Settings) -> dict[str, Any]:
    """The non-secret FLYWHEEL_* settings the pods read (`envFrom`): every value of the endpoint sections (the
    cluster profile fills them in), and every other setting that differs from its default (what the operator
    configured: the gateway's grace and teacher, the namespace, the gate's margins, ...); lists and mappings as
    JSON. URIs with credentials and keys go to the Secret."""
    from pipelines.security import redact_uri

    data: dict[str, str] = {"FLYWHEEL_PROFILE": settings.profile, "FLYWHEEL_ROOT": str(settings.root)}
    for section in sections(settings):
        part = getattr(settings, section)
        dumped = part.model_dump(mode="json")
        for key, field in type(part).model_fields.items():
            value, shown = getattr(part, key), dumped[key]
            if shown is None or key in ("password", "username") or isinstance(value, SecretStr):
                continue  # unset, or a credential: never in a ConfigMap
            if section in POD_ONLY and key not in POD_ONLY[section]:  # e.g. the judge's URL and key: not the pods'
                continue
            if section not in ENDPOINTS and value == field.get_default(call_default_factory=True):
                continue  # the pod's own default is the same
            text = json.dumps(shown) if isinstance(shown, (dict, list)) else str(shown)
            if redact_uri(text) != text:  # carries a password: the Secret's business
                continue
            data[f"FLYWHEEL_{section.upper()}__{key.upper()}"] = text
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": SETTINGS_CONFIG_MAP, "namespace": settings.kubernetes.namespace},
        "data": data,
    }


def secret_data(settings: Settings) -> dict[str, str]:
    """What the `flywheel-secrets` Secret holds: every setting the ConfigMap leaves out because it is a secret (a
    password, a key) or carries one (a database URI with its password), as FLYWHEEL_* variables; the Airflow
    metadata database and the lock database always (the cluster profile requires them). What `kubectl create
    secret generic flywheel-secrets --from-env-file=...` is given."""
    from pipelines.security import redact_uri

    public = settings_config_map(settings)["data"]
    data: dict[str, str] = {}

    def add(name: str, value: Any) -> None:
        if value is None or name in public:
            return
        text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        credential = name.endswith(("__USERNAME", "__PASSWORD"))  # the ConfigMap leaves both out by name
        if isinstance(value, SecretStr) or credential or redact_uri(text) != text:
            data[name] = text

    for section in sections(settings):
        part = getattr(settings, section)
        for key in type(part).model_fields:
            add(f"FLYWHEEL_{section.upper()}__{key.upper()}", getattr(part, key))
    for name, value in (
        ("FLYWHEEL_AIRFLOW__SQL_ALCHEMY_CONN", settings.airflow.sql_alchemy_conn),
        ("FLYWHEEL_STATE_LOCK_URI", settings.state_lock_uri),
    ):
        if value:
            data[name] = str(value)
    data.pop("FLYWHEEL_GATEWAY__API_KEY", None)  # the gateway's key has its own Secret (cluster/gateway.py)
    return dict(sorted(data.items()))
