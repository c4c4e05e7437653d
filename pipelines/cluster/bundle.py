"""Every file `flywheel serve manifests --out DIR` writes, in one place: Triton, the gateway, the settings
ConfigMap, the Helm values for Airflow, and templates of the two Secrets (their keys, never their values: fill
them from `terraform output` and the secret store, e.g. `kubectl create secret generic flywheel-secrets
--from-env-file=...`)."""

from __future__ import annotations

from typing import Any

from pipelines.cluster.airflow import helm_values, metadata_secret
from pipelines.cluster.gateway import gateway_manifests
from pipelines.cluster.training import SECRETS, secret_data, settings_config_map
from pipelines.cluster.triton import triton_manifests
from pipelines.config import Settings


def secrets_template(settings: Settings) -> dict[str, Any]:
    """The `flywheel-secrets` Secret with its keys and a placeholder each (the values never leave the store)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRETS, "namespace": settings.kubernetes.namespace},
        "type": "Opaque",
        "stringData": {key: f"<{key}>" for key in secret_data(settings)},
    }


def manifest_files(
    settings: Settings, *, replicas: int = 2, gpus: int = 1, role_arn: str | None = None, region: str = "us-east-1"
) -> dict[str, list[dict[str, Any]]]:
    """File name -> its YAML documents. ValueError when the settings cannot be served on the cluster."""
    return {
        "triton.yaml": triton_manifests(settings, replicas=replicas, gpus=gpus, role_arn=role_arn, region=region),
        "gateway.yaml": gateway_manifests(settings),
        "flywheel-settings.yaml": [settings_config_map(settings)],
        "flywheel-secrets.template.yaml": [secrets_template(settings)],
        "airflow-metadata-secret.template.yaml": [metadata_secret(settings)],
        "airflow-values.yaml": [helm_values(settings)],  # `helm install ... -f airflow-values.yaml`
    }
