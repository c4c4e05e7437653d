"""Cluster execution without a cluster. The `kubernetes` train runner: the plan's pod manifests,
the DAG's mapped KubernetesPodOperator rendering them (dry run, no API server), and the hand-off:
each variant trained by `python -m pipelines.train.pod` in its own process (what a pod runs), then
the DAG's `train` task collecting the variants from MLflow and picking the best, as after a local
sweep. Triton's manifests (`flywheel serve manifests`), checked against the Kubernetes API schema.
(Spark on a standalone master: tests/test_spark_cluster.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import assert_kubernetes_schema, run_flywheel
from train_data import write_training_set

from pipelines.config import REPO_ROOT, load_settings
from pipelines.errors import NotRetryable

TINY = str(REPO_ROOT / "conf" / "sweeps" / "tiny.yaml")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cluster-root")
    write_training_set(path)
    return path


def _kubernetes_settings(root: Path, **extra):
    return load_settings(
        root=str(root),
        train={"runner": "kubernetes"},
        kubernetes={
            "gpu_node_selector": {"flywheel.io/gpu": "b200"},
            "training_image": "123.dkr.ecr.us-east-1.amazonaws.com/flywheel-training:v7",
        },
        mlflow={"password": "s3cret-value", "username": "u"},
        **extra,
    )


def test_local_runner_plans_no_pods(root: Path) -> None:
    from pipelines import tasks

    assert tasks.train_pods(load_settings(root=str(root)), {"sweep": TINY}) == []


def test_plan_one_gpu_pod_per_variant_rendered_by_the_dags_operator(root: Path) -> None:
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from pipelines import tasks
    from pipelines.cluster.training import SECRETS, SETTINGS_CONFIG_MAP, settings_config_map

    settings = _kubernetes_settings(root)
    pods = tasks.train_pods(settings, {"sweep": TINY, "reference_days": ["2026-11-18", "2026-11-19"]})
    assert len(pods) == 2  # tiny.yaml: a grid of two learning rates
    sys.path.insert(0, str(REPO_ROOT / "dags"))
    import commerce_flywheel

    dag = commerce_flywheel.build("default", 1)  # the default project's DAG (one per project)
    mapped = dag.get_task("train_variant")
    assert mapped.upstream_task_ids == {"train_pods"} and "train_variant" in dag.get_task("train").upstream_task_ids
    assert dag.get_task("train").trigger_rule == "none_failed"  # runs after zero pods (the local runner) too
    for index, pod_dict in enumerate(pods):
        operator = KubernetesPodOperator(
            task_id="train_variant", pod_template_dict=pod_dict, **commerce_flywheel.TRAIN_POD_ARGS
        )
        pod = operator.build_pod_request_obj(dry_run=True)
        container = pod.spec.containers[0]
        assert pod.metadata.namespace == "flywheel" and pod.metadata.name.startswith("train-tiny-")
        assert pod.spec.node_selector == {"flywheel.io/gpu": "b200"}
        assert [(t.key, t.value, t.effect) for t in pod.spec.tolerations] == [("nvidia.com/gpu", "true", "NoSchedule")]
        assert container.resources.limits["nvidia.com/gpu"] == "1" == container.resources.requests["nvidia.com/gpu"]
        assert container.image.endswith("flywheel-training:v7")
        assert pod.spec.service_account_name == "training" and pod.spec.security_context.run_as_non_root
        assert container.command[:3] == ["python", "-m", "pipelines.train.pod"]
        args = dict(zip(container.command[3::2], container.command[4::2]))
        assert args["--index"] == str(index) and args["--reference-days"] == "2026-11-18,2026-11-19"
        assert json.loads(args["--sweep-json"])["grid"]["learning_rate"] == [5e-3, 1e-2]
        assert [e.config_map_ref.name if e.config_map_ref else e.secret_ref.name for e in container.env_from] == [
            SETTINGS_CONFIG_MAP,
            SECRETS,
        ]
        assert_kubernetes_schema(pod_dict)
    config_map = settings_config_map(
        _kubernetes_settings(
            root,
            feast={"online_store": "postgresql://f:pw-xyz@db/f"},
            evaluation={
                "max_new_tokens": 256,
                "judge_api_key": "judge-k3y",
                "judge_url": "https://tok3n@judge.example/v1?api-key=judge-q",
            },
        )
    )
    rendered = yaml.safe_dump(pods) + yaml.safe_dump(config_map)
    assert "s3cret-value" not in rendered and "pw-xyz" not in rendered, "secrets are referenced, never inlined"
    assert "JUDGE" not in rendered and "tok3n" not in rendered and "judge-q" not in rendered  # not the pods' business
    assert config_map["data"]["FLYWHEEL_MLFLOW__REGISTERED_MODEL"] == "commerce-tool-caller"
    # the pods' validation decodes with the evaluation's budget (retail calls need more than the default 64)
    assert config_map["data"]["FLYWHEEL_EVALUATION__MAX_NEW_TOKENS"] == "256"
    assert "FLYWHEEL_FEAST__ONLINE_STORE" not in config_map["data"]  # it carries a password: the Secret's


def test_pods_train_their_variants_and_the_train_task_collects_them(root: Path) -> None:
    from pipelines import tasks
    from pipelines.clients.mlflow import client

    settings = _kubernetes_settings(root)
    pods = tasks.train_pods(settings, {"sweep": TINY})
    env = {**os.environ, "FLYWHEEL_ROOT": str(root), "FLYWHEEL_TRAIN__RUNNER": "local", "PYTHONPATH": str(REPO_ROOT)}
    reported = {}
    for pod in pods:  # what each pod's container runs, here one process after another
        command = pod["spec"]["containers"][0]["command"]
        done = subprocess.run(
            [sys.executable, *command[1:]],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd=str(root),
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["status"] == "completed"
        reported[result["run_id"]] = result["metrics"]
    unrun = root / "unrun.yaml"  # a sweep whose pods never ran: one clear error, not a silent empty sweep
    unrun.write_text(Path(TINY).read_text().replace("name: tiny", "name: unrun"))
    with pytest.raises(NotRetryable, match="variant 0 has no finished run"):
        tasks.train(settings, {"sweep": str(unrun)})
    trained = tasks.train(settings, {"sweep": TINY})
    runs = client(settings).search_runs(
        [client(settings).get_experiment_by_name("commerce-flywheel").experiment_id],
        f"tags.`flywheel.sweep_id` = '{trained['sweep_id']}'",
    )
    assert len(runs) == 3  # one parent (created by the plan) and the two variants the pods logged
    assert trained["best_run_id"] in {r.info.run_id for r in runs if "flywheel.variant" in r.data.tags}
    assert (Path(trained["adapter_dir"]) / "adapter_config.json").is_file()  # fetched from the artifact store
    # the collector hands on exactly what the best pod measured (not a default or a re-computation)
    best = reported[trained["best_run_id"]]
    assert {k: trained["metrics"][k] for k in best} == pytest.approx(best) and "val_exact_match" in best
    assert best["val_exact_match"] == max(m["val_exact_match"] for m in reported.values())


def test_triton_manifests_serve_the_s3_repository_on_the_gpu_pool(tmp_path: Path) -> None:
    env = {
        "FLYWHEEL_ROOT": str(tmp_path / "fw"),
        "FLYWHEEL_TRITON__MODEL_REPOSITORY": "s3://models-bucket/repo",
        "FLYWHEEL_KUBERNETES__GPU_NODE_SELECTOR": '{"flywheel.io/gpu": "h100"}',
        "FLYWHEEL_MLFLOW__PASSWORD": "s3cret-value",
    }
    out = tmp_path / "k8s"
    made = run_flywheel(
        "serve",
        "manifests",
        "--out",
        str(out),
        "--replicas",
        "3",
        "--gpus",
        "2",
        "--role-arn",
        "arn:aws:iam::123456789012:role/flywheel-triton",
        "--json",
        env=env,
    )
    assert made.returncode == 0, made.stderr
    # no credentials for the bucket here: the manifests are still written, and the result says what is left
    assert json.loads(made.stdout)["repository"].startswith("not created"), made.stdout
    docs = list(yaml.safe_load_all((out / "triton.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Deployment", "Service", "PodDisruptionBudget"]
    for doc in docs + list(yaml.safe_load_all((out / "flywheel-settings.yaml").read_text())):
        assert_kubernetes_schema(doc)
    account, deployment, service, budget = docs
    assert account["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].endswith("role/flywheel-triton")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert deployment["spec"]["replicas"] == 3 and container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert "--model-repository=s3://models-bucket/repo" in container["command"]
    assert "--model-control-mode=explicit" in container["command"]  # versions are loaded by `flywheel deploy`
    assert pod["nodeSelector"] == {"flywheel.io/gpu": "h100"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert pod["serviceAccountName"] == "triton" and pod["securityContext"]["runAsNonRoot"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert budget["spec"]["minAvailable"] == 1
    assert "s3cret-value" not in (out / "triton.yaml").read_text() + (out / "flywheel-settings.yaml").read_text()
    # the gateway: Kubernetes restarts it on its liveness and sends it traffic on its readiness (Triton up,
    # every route's model loaded), and its key comes from a Secret, never the manifest
    gateway, gateway_service = yaml.safe_load_all((out / "gateway.yaml").read_text())
    for doc in (gateway, gateway_service):
        assert_kubernetes_schema(doc)
    box = gateway["spec"]["template"]["spec"]["containers"][0]
    assert box["livenessProbe"]["httpGet"]["path"] == "/livez" and box["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert box["command"] == ["python", "-m", "pipelines.gateway"]
    key = next(e for e in box["env"] if e["name"] == "FLYWHEEL_GATEWAY__API_KEY")
    assert "secretKeyRef" in key["valueFrom"] and "value" not in key
    replica = next(e for e in box["env"] if e["name"] == "FLYWHEEL_GATEWAY__REPLICA")  # its own usage file
    assert replica["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # its stop (drain 20 s, the turns' file, captures and usage written) fits before SIGKILL
    assert gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 45
    assert "s3cret-value" not in (out / "gateway.yaml").read_text()

    local = run_flywheel("serve", "manifests", "--out", str(out), env={"FLYWHEEL_ROOT": str(tmp_path / "fw")})
    assert local.returncode == 2 and "s3://" in local.stderr  # a local folder cannot be the cluster's repository


def test_model_folders_are_published_to_an_object_store_repository(tmp_path: Path) -> None:
    from pipelines.serve.repository import publish

    folder = tmp_path / "build" / "tool_router_v3"
    (folder / "1" / "adapter").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('name: "tool_router_v3"')
    (folder / "1" / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "1" / "flywheel.json").write_text('{"registry_version": "3"}')
    remote = f"memory://repo-{tmp_path.name}"  # fsspec's in-memory store: the S3 code path without S3
    settings = load_settings(root=str(tmp_path / "fw"), triton={"model_repository": remote})
    assert publish(settings, folder) == (f"{remote}/tool_router_v3", False)
    import fsspec

    fs = fsspec.filesystem("memory")
    names = sorted(p.split("tool_router_v3/", 1)[1] for p in fs.find(f"/repo-{tmp_path.name}/tool_router_v3"))
    assert names == ["1/adapter/adapter_config.json", "1/flywheel.json", "config.pbtxt"]


def test_every_setting_reaches_the_pods_through_the_config_map_and_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings -> the ConfigMap and the Secret -> a pod's environment -> the settings it loads: the same, but the
    judge's URL (not the pods' business). The gateway's grace and teacher, the namespace, the gate's margin, lists.
    (Mutation: the ConfigMap back to its five endpoint sections: the gateway pod runs with the default grace and
    no teacher, and this fails.)"""
    from test_config import CLUSTER

    from pipelines.cluster.training import secret_data, settings_config_map

    cluster = {
        **CLUSTER,
        "airflow": {"sql_alchemy_conn": "postgresql+psycopg2://airflow:pw-a@db:5432/airflow"},  # a password in it
        "mlflow": {**CLUSTER["mlflow"], "username": "admin", "password": "s3cret-value"},
        "gateway": {"shutdown_grace_s": 15, "teacher_url": "http://teacher.flywheel.svc:8000/v1"},
        "kubernetes": {"namespace": "shop", "gpu_node_selector": {"flywheel.io/gpu": "h200"}},
        "promotion": {"non_inferiority_margin": 0.03},
        "train": {"precision": "fp32", "runner": "kubernetes"},
        "bench": {"concurrency": [1, 8]},
    }
    settings = load_settings(**cluster)
    pod_env = {**settings_config_map(settings)["data"], **secret_data(settings)}
    for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)
    for name, value in pod_env.items():
        monkeypatch.setenv(name, value)
    rebuilt = load_settings()
    want, got = settings.model_dump(mode="json"), rebuilt.model_dump(mode="json")
    for side in (want, got):
        side["evaluation"].pop("judge_url")
    for section in want:
        assert got[section] == want[section], section
    assert rebuilt.gateway.teacher_url == "http://teacher.flywheel.svc:8000/v1"
    assert rebuilt.mlflow.password.get_secret_value() == "s3cret-value"
    assert "s3cret-value" not in json.dumps(settings_config_map(settings))
