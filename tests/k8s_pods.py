"""Run a manifest's container on this machine as Kubernetes would run it: the environment resolved exactly as the
kubelet resolves it (`envFrom` ConfigMaps and Secrets first, then `env` over them: plain values, `fieldRef`,
`secretKeyRef`, `configMapKeyRef`; a missing object that is not `optional` stops the container, as it would
stop the pod), the image replaced by this checkout's venv, the container's volume mounts by folders.

What differs from a real pod, and only this: the image's programs (`python`, `tritonserver`) are this machine's;
each container's mount paths are local folders (the same folder again for a restart with the same volume); the
pod's own address is 127.0.0.1 with a free port per container port (`ports`); object storage is the local
S3-compatible server (`AWS_ENDPOINT_URL`, and for Triton's own S3 client the `s3://host:port/bucket` form), where
a pod reaches S3 through its IAM role.

A stand-in for the kubelet and the API server: no Kubernetes cluster can run here, so no test starts a real pod.
The manifests themselves are checked against the Kubernetes API schema in
tests/test_cluster.py::test_triton_manifests_serve_the_s3_repository_on_the_gpu_pool.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class PodWouldNotStart(AssertionError):
    """What the kubelet would refuse: a referenced ConfigMap, Secret or key that does not exist."""


@dataclass
class Cluster:
    """The objects the API server holds (ConfigMaps and Secrets by name) and the pod's identity."""

    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    namespace: str = "flywheel"

    def add(self, manifest: dict[str, Any]) -> None:
        name = manifest["metadata"]["name"]
        if manifest["kind"] == "ConfigMap":
            self.config_maps[name] = {k: str(v) for k, v in (manifest.get("data") or {}).items()}
        elif manifest["kind"] == "Secret":
            self.secrets[name] = {k: str(v) for k, v in (manifest.get("stringData") or {}).items()}


def _source(cluster: Cluster, ref: dict[str, Any], kind: str) -> dict[str, str] | None:
    found = (cluster.config_maps if kind == "configMap" else cluster.secrets).get(ref["name"])
    if found is None and not ref.get("optional", False):
        raise PodWouldNotStart(f"{kind} {ref['name']} does not exist (CreateContainerConfigError)")
    return found


def container_env(cluster: Cluster, container: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it (no other variable: no host environment)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind = "configMap" if "configMapRef" in source else "secret"
        data = _source(cluster, source[f"{kind}Ref"], kind)
        env.update(data or {})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
            continue
        ref = item["valueFrom"]
        if "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            env[item["name"]] = {"metadata.name": pod_name, "metadata.namespace": cluster.namespace}[path]
            continue
        kind = "configMap" if "configMapKeyRef" in ref else "secret"
        key_ref = ref[f"{kind}KeyRef"]
        data = _source(cluster, key_ref, kind) or {}
        if key_ref["key"] not in data and not key_ref.get("optional", False):
            raise PodWouldNotStart(f"{kind} {key_ref['name']} has no key {key_ref['key']}")
        if key_ref["key"] in data:
            env[item["name"]] = data[key_ref["key"]]
    return env


@dataclass
class Local:
    """How one container runs here: its mount paths' folders, its ports' local numbers, the S3 endpoint."""

    mounts: dict[str, Path]
    ports: dict[int, int]
    s3_endpoint: str
    extra_env: dict[str, str] = field(default_factory=dict)  # what the image itself sets (PATH, the libraries)


def local_env(env: dict[str, str], local: Local) -> dict[str, str]:
    """The pod's environment with its mount paths, its address and its object storage mapped to this machine."""
    out = {}
    for key, value in env.items():
        for mount, folder in local.mounts.items():
            value = value.replace(mount, str(folder))
        value = value.replace("0.0.0.0", "127.0.0.1")  # noqa: S104 (the pod's own address is ours here)
        for port, mapped in local.ports.items():
            if value == str(port):
                value = str(mapped)
        out[key] = value
    aws = {
        "AWS_ENDPOINT_URL": local.s3_endpoint,
        "AWS_ACCESS_KEY_ID": "flywheel-test",
        "AWS_SECRET_ACCESS_KEY": "flywheel-test-secret",
        "AWS_DEFAULT_REGION": env.get("AWS_DEFAULT_REGION", "us-east-1"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    base = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "NO_PROXY": "127.0.0.1,localhost"}
    return {**base, **aws, **local.extra_env, **out}


def local_command(container: dict[str, Any]) -> list[str]:
    """The container's command with the image's `python` replaced by this checkout's venv."""
    command = [*container.get("command", []), *container.get("args", [])]
    if command and command[0] == "python":
        command[0] = str(REPO / ".venv" / "bin" / "python")
    return command


def start(command: list[str], env: dict[str, str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen(  # noqa: S603
            command, env=env, cwd=str(cwd or REPO), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def probe_ok(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path) -> None:
    """The readiness probe passes within `timeout_s`, else the test fails with the container's log tail."""
    import time

    deadline = time.monotonic() + timeout_s
    while not probe_ok(url):
        if proc.poll() is not None:
            raise AssertionError(f"the container exited ({proc.returncode}): {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} not ready within {timeout_s:g} s: {log.read_text()[-3000:]}")
        time.sleep(0.5)
