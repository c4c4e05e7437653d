"""Values for the official Apache Airflow Helm chart (`helm install airflow apache-airflow/airflow -f values.yaml`):
Airflow on the cluster runs this repository's DAGs with the platform's image, settings and secrets.

Every Airflow component (API server, scheduler, DAG processor, triggerer, and the pods the KubernetesExecutor starts
for tasks) gets the environment the training pods and the gateway get: the `flywheel-settings` ConfigMap and the
`flywheel-secrets` Secret (`extraEnvFrom`), so a task builds the same settings (`pipelines.airflow_tasks`). The
metadata database is the cluster's PostgreSQL (`data.metadataSecretName`, a Secret with the `connection` key the
chart reads); the chart's own PostgreSQL is off. `flywheel serve manifests --out DIR` writes them beside the other
manifests as `airflow-values.yaml`.
"""

from __future__ import annotations

from typing import Any

from pipelines.cluster.training import SECRETS, SETTINGS_CONFIG_MAP
from pipelines.config import Settings

METADATA_SECRET = "flywheel-airflow-metadata"  # noqa: S105 (a Secret's name; its `connection` key holds the URI)
API_PORT = 8080
HEALTH_PATH = "/api/v2/monitor/health"


def helm_values(settings: Settings) -> dict[str, Any]:
    image, _, tag = settings.kubernetes.gateway_image.partition(":")
    return {
        "executor": "KubernetesExecutor",
        "airflowVersion": "3.3.2",
        "images": {"airflow": {"repository": image, "tag": tag or "latest", "pullPolicy": "IfNotPresent"}},
        "postgresql": {"enabled": False},  # the cluster's own PostgreSQL (terraform/modules/rds)
        "data": {"metadataSecretName": METADATA_SECRET},
        "env": [{"name": "FLYWHEEL_PROFILE", "value": "cluster"}, {"name": "SPARK_LOCAL_IP", "value": "0.0.0.0"}],  # noqa: S104 (in the pod)
        "extraEnvFrom": f"- configMapRef:\n    name: {SETTINGS_CONFIG_MAP}\n- secretRef:\n    name: {SECRETS}\n",
        "config": {
            "core": {"load_examples": "False", "dags_are_paused_at_creation": "False"},
            "logging": {"logging_level": "INFO"},
        },
        "dags": {"gitSync": {"enabled": True, "subPath": "dags"}},  # this repository's dags/ (repo set at install)
        "apiServer": {"replicas": 1, "service": {"ports": [{"name": "api-server", "port": API_PORT}]}},
        "scheduler": {"replicas": 1},
        "dagProcessor": {"enabled": True},
        "triggerer": {"enabled": True},
        "serviceAccount": {"create": True, "name": "airflow"},  # the role that reads the zones (terraform iam)
    }


def metadata_secret(settings: Settings) -> dict[str, Any]:
    """The Secret the chart reads the metadata database's URI from (its value from `airflow.sql_alchemy_conn`:
    create it with `kubectl create secret generic flywheel-airflow-metadata --from-literal=connection=...`)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": METADATA_SECRET, "namespace": settings.kubernetes.namespace},
        "type": "Opaque",
        "stringData": {"connection": "<airflow.sql_alchemy_conn>"},
    }
