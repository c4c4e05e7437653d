"""Kubernetes manifests for Triton on the cluster: the official Triton image serving the model
repository on S3, on the GPU node group.

`flywheel serve manifests --out DIR` writes them (`kubectl apply -f DIR`). The server starts with
`--model-control-mode=explicit`, so the same `pipelines.serve.deploy` that drives the local binary
loads, smoke-tests, switches and rolls back versions through Triton's API on the cluster; the
repository is the S3 prefix `deploy` publishes to. S3 access comes from the `triton` service
account's IAM role (terraform/modules/iam: read-only on the models bucket), never from keys.
"""

from __future__ import annotations

from typing import Any

from pipelines.cluster.training import GPU_TOLERATION
from pipelines.config import Settings

APP = "triton"
PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "commerce-flywheel"}


def rolling_deployment(app: str, meta: dict[str, Any], replicas: int, template: dict[str, Any]) -> dict[str, Any]:
    """A Deployment that never drops below `replicas` while it rolls (one pod more, none less)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, **meta},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/name": app}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": template,
        },
    }


def _command(repository: str) -> list[str]:
    """Triton's command line: the S3 repository, models loaded by `flywheel deploy`, our ports."""
    return [
        "tritonserver",
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        "--strict-readiness=false",  # ready while idle: versions are loaded by `flywheel deploy`
        "--exit-on-error=false",
        "--log-verbose=0",
        f"--http-port={PORTS['http']}",
        f"--grpc-port={PORTS['grpc']}",
        f"--metrics-port={PORTS['metrics']}",
    ]


def _container(settings: Settings, repository: str, gpus: int, region: str) -> dict[str, Any]:
    """The Triton container: its image and command, the GPUs, the probes and its volumes' mounts."""
    probe = {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3}
    return {
        "name": APP,
        "image": settings.kubernetes.triton_image,
        "command": _command(repository),
        "env": [
            {"name": "AWS_REGION", "value": region},
            {"name": "AWS_DEFAULT_REGION", "value": region},
        ],
        "ports": [{"name": name, "containerPort": port} for name, port in PORTS.items()],
        "resources": {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"nvidia.com/gpu": str(gpus), "cpu": "4", "memory": "32Gi"},
        },
        "startupProbe": {**probe, "failureThreshold": 60},  # image and weights take minutes
        "readinessProbe": probe,
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "periodSeconds": 15,
            "failureThreshold": 4,
        },
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 (the pod's memory-backed volume)
            {"name": "cache", "mountPath": "/home/triton-server/.cache"},
        ],
    }


def _pod_template(settings: Settings, container: dict[str, Any]) -> dict[str, Any]:
    """The pod: on the GPU node group, as the `triton` service account, non-root, scraped by Prometheus."""
    return {
        "metadata": {
            "labels": _labels(),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(PORTS["metrics"])},
        },
        "spec": {
            "serviceAccountName": APP,
            "nodeSelector": dict(settings.kubernetes.gpu_node_selector),
            "tolerations": [dict(GPU_TOLERATION)],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000},
            "containers": [container],
            "volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}},
                {"name": "cache", "emptyDir": {}},
            ],
        },
    }


def _service_account(meta: dict[str, Any], role_arn: str | None) -> dict[str, Any]:
    """The `triton` service account, with the IAM role that reads the models bucket when one is given."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": APP,
            **meta,
            **({"annotations": {"eks.amazonaws.com/role-arn": role_arn}} if role_arn else {}),
        },
    }


def cluster_service(app: str, meta: dict[str, Any], ports: dict[str, int]) -> dict[str, Any]:
    """A ClusterIP Service in front of the pods labelled `app`, one port per named container port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": app, **meta},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app.kubernetes.io/name": app},
            "ports": [{"name": name, "port": port, "targetPort": name} for name, port in ports.items()],
        },
    }


def _disruption_budget(meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": APP, **meta},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": APP}}},
    }


def triton_manifests(
    settings: Settings, *, replicas: int = 2, gpus: int = 1, role_arn: str | None = None, region: str = "us-east-1"
) -> list[dict[str, Any]]:
    """ServiceAccount, Deployment, Service and PodDisruptionBudget for the Triton server."""
    meta = {"namespace": settings.kubernetes.namespace, "labels": _labels()}
    repository = str(settings.triton.model_repository)
    if not repository.startswith("s3://"):
        raise ValueError(f"triton.model_repository: the cluster serves from S3 (s3://bucket/prefix), got {repository}")
    account = _service_account(meta, role_arn)
    template = _pod_template(settings, _container(settings, repository, gpus, region))
    deployment = rolling_deployment(APP, meta, replicas, template)
    return [account, deployment, cluster_service(APP, meta, PORTS), _disruption_budget(meta)]
