from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config import ConfigError, load_settings

CLUSTER = {
    "profile": "cluster",
    "root": "s3://acme-flywheel/prod",
    "airflow": {"sql_alchemy_conn": "postgresql+psycopg2://airflow@db:5432/airflow"},
    "mlflow": {
        "tracking_uri": "http://mlflow.flywheel.svc:5000",
        "backend_store_uri": "postgresql://mlflow@db:5432/mlflow",
        "artifacts_destination": "s3://acme-flywheel/prod/runs/artifacts",
    },
    "spark": {"master": "spark://spark-master:7077"},
    "triton": {"url": "triton.flywheel.svc:8000", "model_repository": "s3://acme-flywheel/prod/serving"},
    "feast": {"registry": "postgresql://feast@db:5432/feast", "online_store": "postgresql://feast@db:5432/feast"},
}


def test_local_profile_fills_embedded_defaults(flywheel_root: Path) -> None:
    s = load_settings()
    assert s.profile == "local"
    assert s.root == str(flywheel_root.resolve())
    assert s.airflow.sql_alchemy_conn == f"sqlite:///{flywheel_root.resolve()}/airflow/airflow.db"
    assert s.mlflow.backend_store_uri.startswith("sqlite:///") and s.mlflow.tracking_uri == s.mlflow.backend_store_uri
    assert s.spark.master == "local[*]"
    assert s.triton.host == s.mlflow.host == s.airflow.host == "127.0.0.1"
    assert s.zone("raw") == f"{flywheel_root.resolve()}/raw"
    assert s.spark.conf["spark.sql.adaptive.enabled"] == "true"
    assert "spark.plugins" not in s.spark.effective_conf()


def test_env_overrides_nested_fields(flywheel_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_MLFLOW__PORT", "5123")
    monkeypatch.setenv("FLYWHEEL_SPARK__RAPIDS", "true")
    s = load_settings()
    assert s.mlflow.port == 5123
    assert s.spark.effective_conf()["spark.plugins"] == "com.nvidia.spark.SQLPlugin"


def test_yaml_file_is_read_and_env_wins_over_it(
    flywheel_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "flywheel.yaml"
    cfg.write_text("mlflow:\n  port: 5300\n  experiment: yaml-exp\nairflow:\n  parallelism: 2\n")
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(cfg))
    monkeypatch.setenv("FLYWHEEL_MLFLOW__PORT", "5400")
    s = load_settings()
    assert (s.mlflow.port, s.mlflow.experiment, s.airflow.parallelism) == (5400, "yaml-exp", 2)


def test_cluster_profile_takes_terraform_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLYWHEEL_ROOT", raising=False)
    s = load_settings(**CLUSTER)
    assert s.zone("curated") == "s3://acme-flywheel/prod/curated"
    assert s.spark.master == "spark://spark-master:7077"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"root": None}, "root"),
        ({"root": "/data/flywheel"}, "root"),
        ({"spark": {"master": None}}, "spark.master"),
        ({"mlflow": {**CLUSTER["mlflow"], "backend_store_uri": "sqlite:///x.db"}}, "mlflow.backend_store_uri"),
    ],
)
def test_cluster_profile_names_the_missing_or_bad_field(
    change: dict, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FLYWHEEL_ROOT", raising=False)
    with pytest.raises(ConfigError, match=rf"{field}:"):
        load_settings(**{**CLUSTER, **change})


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"FLYWHEEL_MLFLOW__PORT": "99999"}, "mlflow.port"),
        ({"FLYWHEEL_PROFILE": "laptop"}, "profile"),
        ({"FLYWHEEL_SPARK__MASTER": "mesos://x"}, "spark.master"),
        ({"FLYWHEEL_AIRFLOW__HOST": "0.0.0.0"}, "airflow.host"),
        ({"FLYWHEEL_AIRFLOW__PARALLELISM": "four"}, "airflow.parallelism"),
    ],
)
def test_invalid_values_fail_with_the_field_name(
    flywheel_root: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], field: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert field in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_yaml_file_is_a_config_error(flywheel_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_CONFIG", "/nonexistent/flywheel.yaml")
    with pytest.raises(ConfigError, match="FLYWHEEL_CONFIG"):
        load_settings()


def test_secrets_are_masked_when_dumped(flywheel_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_MLFLOW__PASSWORD", "hunter2-secret")
    dumped = str(load_settings().model_dump(mode="json"))
    assert "hunter2-secret" not in dumped


def test_served_decoding_follows_how_triton_serves(flywheel_root: Path) -> None:
    from pipelines.config import decoding_modes

    assert decoding_modes("served", True) == "on" and decoding_modes("served", False) == "off"
    assert decoding_modes("both", True) == "both" and decoding_modes("off", True) == "off"
    assert load_settings().evaluation.constrained == "served" == load_settings().bench.constrained
