"""Kubernetes manifests for the gateway on the cluster: a Deployment whose probes are the gateway's own
liveness (`/livez`: restart a stuck process) and readiness (`/ready`: no traffic while Triton is down or a
route's model is not loaded), and its Service. The API key comes from a Secret, never from the manifest."""

from __future__ import annotations

from typing import Any

from pipelines.cluster.training import SECRETS, SETTINGS_CONFIG_MAP
from pipelines.cluster.triton import cluster_service, rolling_deployment
from pipelines.config import Settings

APP = "flywheel-gateway"
PORT = 8400
KEY_SECRET = "flywheel-gateway-key"  # noqa: S105 (a Secret's name: kubectl create secret generic flywheel-gateway-key --from-literal=key=...)


def gateway_manifests(settings: Settings, *, replicas: int = 2) -> list[dict[str, Any]]:
    k = settings.kubernetes
    labels = {"app.kubernetes.io/name": APP, "app.kubernetes.io/part-of": "commerce-flywheel"}
    meta = {"namespace": k.namespace, "labels": labels}
    probe = {"periodSeconds": 10, "timeoutSeconds": 5}
    deployment = rolling_deployment(
        APP,
        meta,
        replicas,
        {
            "metadata": {"labels": labels},
            "spec": {
                "serviceAccountName": "airflow",  # reads the raw zone and the serving state (terraform/modules/iam)
                "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                # a stop is bounded by gateway.shutdown_grace_s (drain, the captures' upload, the usage, the
                # turns' file): Kubernetes waits that plus a margin before SIGKILL
                "terminationGracePeriodSeconds": int(settings.gateway.shutdown_grace_s) + 10,
                "containers": [
                    {
                        "name": "gateway",
                        "image": k.gateway_image,
                        "command": ["python", "-m", "pipelines.gateway"],
                        "env": [
                            {"name": "FLYWHEEL_PROFILE", "value": "cluster"},
                            {"name": "HOME", "value": "/home/flywheel"},
                            {"name": "FLYWHEEL_GATEWAY__HOST", "value": "0.0.0.0"},  # noqa: S104 (in the pod)
                            {"name": "FLYWHEEL_GATEWAY__PORT", "value": str(PORT)},
                            # MLflow on the request path (the routing table): fail fast, no retry storms
                            {"name": "MLFLOW_HTTP_REQUEST_TIMEOUT", "value": "5"},
                            {"name": "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "value": "0"},
                            # each replica counts its usage in its own file (gateway/usage/<day>/<pod>.json)
                            {
                                "name": "FLYWHEEL_GATEWAY__REPLICA",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {
                                "name": "FLYWHEEL_GATEWAY__API_KEY",
                                "valueFrom": {"secretKeyRef": {"name": KEY_SECRET, "key": "key"}},
                            },
                        ],
                        # the same settings the training pods get: the ConfigMap (no secrets) and the Secret (the
                        # database URIs the cluster profile requires, MLflow's password, Feast's stores)
                        "envFrom": [{"configMapRef": {"name": SETTINGS_CONFIG_MAP}}, {"secretRef": {"name": SECRETS}}],
                        "ports": [{"name": "http", "containerPort": PORT}],
                        "startupProbe": {
                            "httpGet": {"path": "/livez", "port": "http"},
                            **probe,
                            "failureThreshold": 30,
                        },
                        "livenessProbe": {
                            "httpGet": {"path": "/livez", "port": "http"},
                            **probe,
                            "failureThreshold": 3,
                        },
                        "readinessProbe": {
                            "httpGet": {"path": "/ready", "port": "http"},
                            **probe,
                            "failureThreshold": 2,
                        },
                        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                        # the capture spool (~/.flywheel) outlives a container restart inside the pod
                        "volumeMounts": [{"name": "home", "mountPath": "/home/flywheel"}],
                    }
                ],
                "volumes": [{"name": "home", "emptyDir": {}}],
            },
        },
    )
    return [deployment, cluster_service(APP, meta, {"http": PORT})]
