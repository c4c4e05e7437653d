"""The cluster profile tested as it runs: every manifest the platform writes (`cluster/bundle.py`: the training
pod, Triton, the gateway, the settings ConfigMap, Airflow's Helm values) is rendered, and each container's command
is started here with exactly the environment Kubernetes would give it (tests/k8s_pods.py: the ConfigMap, the
Secrets and the field references resolved; only the image, the mount paths, the pod's address and the S3
endpoint mapped to this machine), against PostgreSQL, the S3-compatible server and an authenticated MLflow.

The run is the cluster's own order: the training pod trains its variant into MLflow, the DAG's tasks (as an Airflow
worker runs them) collect, register and deploy it onto the Triton pod, the gateway pod becomes ready and answers,
is SIGKILLed and restarted with the same volume, and no acknowledged capture is lost; Airflow's API server,
configured as the Helm values configure it, migrates its database, parses the DAGs and passes its probe."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import create_databases
from k8s_pods import Cluster, Local, container_env, local_command, local_env, start, wait_ready
from ports import free_port
from s3_server import TEST_ENV, clear_fs_caches, make_bucket, moto_server
from train_data import write_training_set

from pipelines import storage
from pipelines.config import REPO_ROOT, load_settings

pytestmark = pytest.mark.slow
TINY = str(REPO_ROOT / "conf" / "sweeps" / "tiny.yaml")
KEY = "fw-cluster-run-test-key-000000000000"


def _upload_training_set(local_root: Path, bucket: str) -> None:
    """A small curated training set, as the features stage leaves it, under the cluster root on S3."""
    write_training_set(local_root)
    fs, _ = storage.fs_for(bucket)
    remote = f"{bucket}/fw/curated"
    fs.put(str(local_root / "curated") + "/", remote.removeprefix("s3://") + "/", recursive=True)
    manifest = json.loads((local_root / "curated" / "manifest.json").read_text())
    files = [f"{remote}/{Path(f).relative_to(local_root / 'curated')}" for f in manifest["training_set"]["files"]]
    manifest["training_set"].update(uri=f"{remote}/sft", files=sorted(files))
    storage.write_json(f"{remote}/manifest.json", manifest)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, postgres) -> Any:
    """The cluster's services on loopback (S3, PostgreSQL, MLflow with basic auth) and its settings."""
    from pipelines.clients import mlflow as mlflow_client
    from pipelines.services import start as start_service
    from pipelines.services import stop

    tmp = tmp_path_factory.mktemp("cluster-run")
    saved = dict(os.environ)
    with moto_server(log_dir=tmp) as endpoint:
        os.environ.update({**TEST_ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"})
        os.environ.update({"HOME": str(tmp / "worker-home"), "AWS_CONFIG_FILE": "/dev/null"})
        clear_fs_caches()
        bucket = make_bucket(f"fw-{uuid.uuid4().hex[:10]}")
        db = {name: f"run_{name}_{uuid.uuid4().hex[:6]}" for name in ("airflow", "mlflow", "mlflow_auth", "feast")}
        create_databases(postgres, *db.values())
        mlflow_port = free_port()
        server = load_settings(
            root=str(tmp / "mlflow-root"),
            mlflow={
                "port": mlflow_port,
                "backend_store_uri": postgres.uri(db["mlflow"]),
                "artifacts_destination": f"{bucket}/mlflow",
                "auth_database_uri": postgres.uri(db["mlflow_auth"]),
            },
        )
        start_service(str(server.root), mlflow_client.server_spec(server), host="127.0.0.1", port=mlflow_port)
        ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
        settings = load_settings(
            profile="cluster",
            root=f"{bucket}/fw",
            airflow={"sql_alchemy_conn": postgres.uri(db["airflow"])},
            mlflow={
                "tracking_uri": f"http://127.0.0.1:{mlflow_port}",
                "backend_store_uri": postgres.uri(db["mlflow"]),
                "artifacts_destination": f"{bucket}/mlflow",
                "username": "admin",
                "password": mlflow_client.admin_password(server),
            },
            spark={"master": "local[1]"},
            triton={
                "url": f"127.0.0.1:{ports['http']}",
                "model_repository": f"{bucket}/models",
                # the Triton image's own Python environment is, here, this checkout's serving venv
                "execution_env": str(REPO_ROOT / ".venv-serve"),
                "smoke_requests": 2,
                "smoke_min_valid_json": 0.0,  # an untrained tiny model writes no JSON: the plumbing is the test
                "max_new_tokens": 12,
                "max_input_tokens": 2048,
            },
            feast={
                "registry": postgres.uri(db["feast"], "postgresql"),
                "online_store": postgres.uri(db["feast"], "postgresql"),
            },
            gateway={"api_key": KEY, "base_as_teacher": False},
            promotion={"baseline": "none"},
        )
        _upload_training_set(tmp / "training-set", bucket)
        try:
            yield {"settings": settings, "endpoint": endpoint, "bucket": bucket, "tmp": tmp, "triton": ports}
        finally:
            stop(str(server.root), "mlflow")
            os.environ.clear()
            os.environ.update(saved)
            clear_fs_caches()


def _cluster(settings: Any) -> tuple[Cluster, dict[str, list[dict[str, Any]]]]:
    """The objects the cluster holds: every manifest of the bundle, and the Secrets' values (from the store)."""
    from pipelines.cluster.bundle import manifest_files
    from pipelines.cluster.gateway import KEY_SECRET
    from pipelines.cluster.training import SECRETS, secret_data

    files = manifest_files(settings)
    cluster = Cluster(namespace=settings.kubernetes.namespace)
    for manifests in files.values():
        for manifest in manifests:
            if manifest.get("kind") in ("ConfigMap",):
                cluster.add(manifest)
    cluster.secrets[SECRETS] = secret_data(settings)
    cluster.secrets[KEY_SECRET] = {"key": KEY}
    return cluster, files


def _container(files: dict[str, list[dict[str, Any]]], file: str, kind: str = "Deployment") -> dict[str, Any]:
    manifest = next(m for m in files[file] if m.get("kind") == kind)
    return manifest["spec"]["template"]["spec"]["containers"][0]


def _train_in_the_pods(settings: Any, cluster: Cluster, tmp: Path, endpoint: str) -> Any:
    """The plan's pods (`tasks.train_pods`, one per variant), each command with its environment as Kubernetes runs
    it; returns the settings the DAG's tasks run with (the `kubernetes` runner)."""
    from pipelines import tasks

    planner = settings.model_copy(update={"train": settings.train.model_copy(update={"runner": "kubernetes"})})
    for pod in tasks.train_pods(planner, {"sweep": TINY}):
        container = pod["spec"]["containers"][0]
        folders = {"/work": tmp / "pod-work", "/dev/shm": tmp / "pod-shm"}  # noqa: S108 (the pod's volumes)
        for folder in (*folders.values(), tmp / "pod-home"):
            folder.mkdir(exist_ok=True)
        local = Local(mounts=folders, ports={}, s3_endpoint=endpoint, extra_env={"HOME": str(tmp / "pod-home")})
        env = local_env(container_env(cluster, container, pod["metadata"]["name"]), local)
        done = subprocess.run(
            local_command(container), env=env, cwd=tmp / "pod-work", capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert json.loads(done.stdout.strip().splitlines()[-1])["status"] in ("completed", "diverged")
    return planner


def _triton_pod(settings: Any, files: dict, cluster: Cluster, platform: dict) -> subprocess.Popen[bytes]:
    """The Triton Deployment's container: the official image's `tritonserver`, here the bundled binary with its
    Python backend; the S3 repository through the local endpoint; its ports on free loopback ports. The
    repository exists first, as `flywheel serve manifests` leaves it (an empty bucket: Triton is never ready)."""
    from pipelines.serve.repository import ensure_repository
    from pipelines.stack.triton import _backend_dir, bundle_dir

    ensure_repository(settings)
    container = _container(files, "triton.yaml")
    ports, endpoint = platform["triton"], platform["endpoint"]
    host = endpoint.removeprefix("http://")
    command = []
    for arg in container["command"]:
        if arg == "tritonserver":
            arg = str(bundle_dir() / "bin" / "tritonserver")
        elif arg.startswith("--model-repository=s3://"):
            arg = arg.replace("s3://", f"s3://{host}/", 1)
        for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
            arg = arg.replace(f"--{name}-port={port}", f"--{name}-port={ports[name]}")
        command.append(arg)
    local = load_settings(root=str(platform["tmp"] / "triton-image"))
    command += [f"--backend-directory={_backend_dir(local)}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1"]
    bundle = bundle_dir()
    libs = f"{bundle.parent.parent / 'nvidia_pytriton.libs'}:{Path(sys.base_prefix) / 'lib'}"
    env = local_env(
        container_env(cluster, container, "triton-0"),
        Local(
            mounts={},
            ports={},
            s3_endpoint=endpoint,
            extra_env={"LD_LIBRARY_PATH": libs, "HOME": str(platform["tmp"])},
        ),
    )
    log = platform["tmp"] / "triton.log"
    proc = start(command, env, log)
    wait_ready(proc, f"http://127.0.0.1:{ports['http']}/v2/health/ready", 120, log)
    return proc


def _gateway_pod(files: dict, cluster: Cluster, platform: dict, port: int, name: str) -> tuple[Any, Path]:
    container = _container(files, "gateway.yaml")
    env = local_env(
        container_env(cluster, container, name),
        Local(
            mounts={"/home/flywheel": platform["tmp"] / "gateway-home"},
            ports={8400: port},
            s3_endpoint=platform["endpoint"],
        ),
    )
    (platform["tmp"] / "gateway-home").mkdir(exist_ok=True)
    log = platform["tmp"] / f"{name}.log"
    proc = start(local_command(container), env, log)
    wait_ready(proc, f"http://127.0.0.1:{port}/ready", 180, log)
    return proc, log


def _ask(port: int, n: int) -> str:
    body = {
        "model": "champion",
        "messages": [{"role": "user", "content": f"where is order ORD-{n:06d}?"}],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "track_shipment",
                    "parameters": {
                        "type": "object",
                        "properties": {"order_id": {"type": "string"}},
                        "required": ["order_id"],
                    },
                },
            }
        ],
    }
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {KEY}"},
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def test_every_manifest_starts_as_kubernetes_runs_it_and_no_acknowledged_turn_is_lost(platform) -> None:
    from pipelines import tasks

    settings, tmp = platform["settings"], platform["tmp"]
    cluster, files = _cluster(settings)
    planner = _train_in_the_pods(settings, cluster, tmp, platform["endpoint"])
    triton = _triton_pod(settings, files, cluster, platform)
    try:
        trained = tasks.train(planner, {"sweep": TINY})  # the DAG's train task collects the pod's run
        rows = {"table": [{"condition": "tuned_candidate", "exact_match": 0.5, "arg_f1": 0.5, "latency_ms_p50": 10}]}
        promoted = tasks.promote(settings, tasks.register(settings, trained, rows), rows, {})
        assert promoted["promoted"], promoted
        deployed = tasks.deploy(settings, promoted)  # publish to S3, load on the Triton pod, smoke test, switch
        assert deployed["deployed"].endswith("_v1"), deployed

        port = free_port()
        first, log = _gateway_pod(files, cluster, platform, port, "gateway-0")
        acknowledged = [_ask(port, n) for n in range(3)]
        first.send_signal(signal.SIGKILL)  # a container crash: nothing is closed, the spool stays on the volume
        first.wait(30)
        again, _ = _gateway_pod(files, cluster, platform, port, "gateway-0")  # the same pod, the same volume
        acknowledged.append(_ask(port, 3))
        again.send_signal(signal.SIGTERM)  # the pod's stop: it ends within its grace period
        # a clean stop: uvicorn's graceful shutdown, then the signal raised again (exit by SIGTERM), not `_overdue`'s
        # exit 3 past the grace period, nor killed
        assert again.wait(settings.gateway.shutdown_grace_s + 10) in (0, -signal.SIGTERM)
        kept = [f"{settings.zone('raw')}", f"{settings.zone('serving')}/gateway/unusable"]  # a label, or kept apart
        captured = {
            json.loads(line)["record_id"]
            for zone in kept
            for uri in storage.glob(f"{zone}/dt=*/gateway-*.jsonl")
            for line in storage.read_bytes(uri).splitlines()
        }
        assert set(acknowledged) <= captured, (set(acknowledged) - captured, log.read_text()[-2000:])
    finally:
        triton.send_signal(signal.SIGTERM)
        triton.wait(60)


def test_airflow_configured_by_its_helm_values_migrates_parses_the_dags_and_passes_its_probe(platform) -> None:
    """The chart's API server container as the values configure it (its environment: the values' `env`, their
    `extraEnvFrom`, the metadata Secret's connection and the executor, as the chart's templates set them; the DAGs
    where gitSync puts this repository's `dags/`): `airflow db migrate` (the chart's migration job), the DAG files
    import with the cluster profile's settings, and the API server answers its health probe."""
    import yaml

    from pipelines.cluster.airflow import HEALTH_PATH, METADATA_SECRET

    settings, tmp = platform["settings"], platform["tmp"]
    cluster, files = _cluster(settings)
    values = files["airflow-values.yaml"][0]
    cluster.secrets[METADATA_SECRET] = {"connection": str(settings.airflow.sql_alchemy_conn)}
    chart = {  # what the chart's templates give every Airflow container, from these values
        "env": [
            *values["env"],
            {"name": "AIRFLOW__CORE__EXECUTOR", "value": values["executor"]},
            {
                "name": "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                "valueFrom": {"secretKeyRef": {"name": values["data"]["metadataSecretName"], "key": "connection"}},
            },
            *(
                {"name": f"AIRFLOW__{s.upper()}__{k.upper()}", "value": v}
                for s, o in values["config"].items()
                for k, v in o.items()
            ),
        ],
        "envFrom": yaml.safe_load(values["extraEnvFrom"]),
    }
    port = free_port()
    env = local_env(
        container_env(cluster, chart, "airflow-api-server-0"),
        Local(
            mounts={},
            ports={},
            s3_endpoint=platform["endpoint"],
            extra_env={
                "AIRFLOW_HOME": str(tmp / "airflow-home"),
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW__API__PORT": str(port),
                "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
                "HOME": str(tmp / "airflow-home"),
            },
        ),
    )
    airflow = str(REPO_ROOT / ".venv" / "bin" / "airflow")
    migrated = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True, timeout=600)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    # the DAG processor's work, once: parse the DAG files with this environment into the metadata database
    parsed = subprocess.run([airflow, "dags", "reserialize"], env=env, capture_output=True, text=True, timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    listed = subprocess.run(
        [airflow, "dags", "list", "-o", "json"], env=env, capture_output=True, text=True, timeout=600
    )
    table = next((line for line in reversed(listed.stdout.splitlines()) if line.startswith("[")), "[]")
    assert {"commerce_flywheel", "drift_monitor"} <= {d["dag_id"] for d in json.loads(table)}, listed.stdout[-2000:]
    errors = subprocess.run(
        [airflow, "dags", "list-import-errors"], env=env, capture_output=True, text=True, timeout=600
    )
    assert errors.returncode == 0 and "No data found" in errors.stdout, errors.stdout + errors.stderr[-2000:]
    log = tmp / "airflow-api-server.log"
    proc = start([airflow, "api-server"], env, log)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}{HEALTH_PATH}", 240, log)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
