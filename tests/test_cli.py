from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import run_flywheel


def test_help_explains_every_command() -> None:
    out = run_flywheel("--help").stdout
    for command in ("up", "down", "status", "demo", "logs", "config"):
        assert command in out
    assert "--drift" in run_flywheel("logs", "generate", "--help").stdout


def test_generate_json_output_and_files(tmp_path: Path) -> None:
    result = run_flywheel("logs", "generate", "--records", "300", "--seed", "5", "--days", "2",
                          "--end-date", "2026-11-02", "--out", str(tmp_path), "--gzip", "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["records"] == 300 and sum(summary["kinds"].values()) == 300
    assert sorted(p.parent.name for p in tmp_path.rglob("*.jsonl.gz")) == ["dt=2026-11-01", "dt=2026-11-02"]
    check = json.loads(run_flywheel("logs", "check", str(tmp_path), "--json").stdout)
    assert check["lines"] == 300


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["logs", "generate", "--records", "-3"], {}, "--records"),
    (["logs", "generate", "--drift", "winter"], {}, "--drift"),
    (["logs", "generate", "--end-date", "2026-02-30"], {}, "--end-date"),
    (["logs", "generate", "--bad-share", "2"], {}, "--bad-share"),
    (["logs", "check", "/no/such/dir"], {}, "no such file"),
    (["warp"], {}, "No such command"),
    (["config", "show"], {"FLYWHEEL_MLFLOW__PORT": "70000"}, "mlflow.port"),
    (["status"], {"FLYWHEEL_PROFILE": "cloud"}, "profile"),
    (["up"], {"FLYWHEEL_PROFILE": "cluster"}, "required by the cluster profile"),
    (["train", "--sweep", "/no/such/sweep.yaml"], {}, "sweep: no such file"),
    (["train", "--sweep", "conf/sweeps/tiny.yaml"], {}, "run the data path"),
    (["train", "--backend", "jax"], {}, "--backend"),
    (["registry", "rollback"], {}, "no previous champion"),
    (["eval", "--adapter", "/no/adapter"], {}, "--adapter"),
    (["bench", "--concurrency", "1,x"], {}, "--concurrency"),
    (["bench", "--protocol", "ftp"], {}, "bench.protocol"),
    (["bench"], {}, "no live model"),
    (["rollback"], {}, "nothing to roll back to"),
    (["deploy"], {}, "no model version has the alias 'champion'"),
    (["serve", "up"], {"FLYWHEEL_TRITON__EXECUTION_ENV": "/no/env"}, "make serve-env"),
])
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], env: dict[str, str], needle: str) -> None:
    result = run_flywheel(*args, env={"FLYWHEEL_ROOT": str(tmp_path), **env})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_config_show_reports_the_effective_profile(tmp_path: Path) -> None:
    result = run_flywheel("config", "show", "--json", env={"FLYWHEEL_ROOT": str(tmp_path),
                                                           "FLYWHEEL_MLFLOW__PASSWORD": "s3cr3t-value"})
    data = json.loads(result.stdout)
    assert data["profile"] == "local" and data["root"] == str(tmp_path.resolve())
    assert "s3cr3t-value" not in result.stdout
