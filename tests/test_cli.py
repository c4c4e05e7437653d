from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_flywheel

from pipelines.config import REPO_ROOT


def test_help_explains_every_command() -> None:
    out = run_flywheel("--help").stdout
    for command in ("up", "down", "status", "demo", "logs", "config"):
        assert command in out
    assert "--drift" in run_flywheel("logs", "generate", "--help").stdout


def test_help_without_a_terminal_is_plain_text_wrapped_at_words() -> None:
    """In a pipe (CI logs) no panel borders and no cut words: an option's description names its setting whole.
    (Mutation: dropping `plain_help` in `cli.main` brings back the panels and `evaluation.first_…`.)"""
    import subprocess

    from helpers import FLYWHEEL, clean_env

    env = {k: v for k, v in clean_env().items() if k != "COLUMNS"}  # COLUMNS would say: a terminal this wide
    out = subprocess.run([FLYWHEEL, "eval", "--help"], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "evaluation.first_examples" in out and "│" not in out and "…" not in out


def test_generate_json_output_and_files(tmp_path: Path) -> None:
    result = run_flywheel(
        "logs",
        "generate",
        "--records",
        "300",
        "--seed",
        "5",
        "--days",
        "2",
        "--end-date",
        "2026-11-02",
        "--out",
        str(tmp_path),
        "--gzip",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["records"] == 300 and sum(summary["kinds"].values()) == 300
    assert sorted(p.parent.name for p in tmp_path.rglob("*.jsonl.gz")) == ["dt=2026-11-01", "dt=2026-11-02"]
    check = json.loads(run_flywheel("logs", "check", str(tmp_path), "--json").stdout)
    assert check["lines"] == 300


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
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
        (["bench", "--precisions", "fp32,fp8"], {}, "bench.precisions"),
        (["bench"], {}, "no live model"),
        (["rollback"], {}, "nothing to roll back to"),
        (["deploy"], {}, "no model version has the alias 'champion'"),
        (["serve", "up"], {"FLYWHEEL_TRITON__EXECUTION_ENV": "/no/env"}, "make serve-env"),
    ],
)
def test_bad_input_is_one_clear_line(tmp_path: Path, args: list[str], env: dict[str, str], needle: str) -> None:
    result = run_flywheel(*args, env={"FLYWHEEL_ROOT": str(tmp_path), **env})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_config_show_reports_the_effective_profile(tmp_path: Path) -> None:
    result = run_flywheel(
        "config", "show", "--json", env={"FLYWHEEL_ROOT": str(tmp_path), "FLYWHEEL_MLFLOW__PASSWORD": "s3cr3t-value"}
    )
    data = json.loads(result.stdout)
    assert data["profile"] == "local" and data["root"] == str(tmp_path.resolve())
    assert "s3cr3t-value" not in result.stdout


def test_run_through_the_scheduler_before_up_is_one_clear_line(tmp_path: Path) -> None:
    result = run_flywheel("run", "--scheduler", env={"FLYWHEEL_ROOT": str(tmp_path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "flywheel up" in lines[0], result.stderr


@pytest.mark.parametrize(
    ("exc", "needle"),
    [
        ("mlflow", "MLflow: RESOURCE_DOES_NOT_EXIST"),
        ("json", "a JSON file is not valid JSON"),
        ("runtime", "RuntimeError: boom http://user:***@db"),
    ],
)
def test_a_library_error_is_one_line_and_its_traceback_is_kept(
    tmp_path: Path, monkeypatch, capsys, exc: str, needle: str
) -> None:
    """MLflow, Triton, a corrupt file: no traceback on the terminal, one `error:` line, exit 1, and the
    traceback kept in <root>/logs/cli-errors.log (no password of a URI in either)."""
    from mlflow.exceptions import MlflowException

    from pipelines import cli
    from pipelines.clients import mlflow as mlflow_client

    errors = {
        "mlflow": MlflowException("RESOURCE_DOES_NOT_EXIST: no such model\ndetails"),
        "json": json.JSONDecodeError("Expecting value", "{", 1),
        "runtime": RuntimeError("boom http://user:hunter2@db"),
    }

    def fails(*_a, **_k):
        raise errors[exc]

    monkeypatch.setenv("FLYWHEEL_ROOT", str(tmp_path))
    monkeypatch.setattr(mlflow_client, "client", fails)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["registry", "list"])
    err = capsys.readouterr().err
    assert stopped.value.code == 1 and "Traceback" not in err and "hunter2" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    kept = (tmp_path / "logs" / "cli-errors.log").read_text()
    assert "Traceback" in kept and "hunter2" not in kept


def test_running_tasks_are_read_from_the_dags_test_log() -> None:
    from pipelines.stack.airflow import running_tasks

    log = (
        "[DAG TEST] starting task_id=prep map_index=-1\n[DAG TEST] end task task_id=prep map_index=-1\n"
        "[DAG TEST] starting task_id=train_variant map_index=0\n[DAG TEST] end task task_id=train_variant "
        "map_index=0\n[DAG TEST] starting task_id=train_variant map_index=1\n"
        "[DAG TEST] starting task_id=train map_index=-1\n"
    )
    assert running_tasks(log) == ["train_variant[1]", "train"]
    assert running_tasks("") == []


@pytest.mark.slow
def test_a_run_past_its_time_limit_is_stopped_with_one_line_naming_the_task(tmp_path: Path) -> None:
    """`flywheel run` past `airflow.run_timeout_s`: one `error:` line naming where it stopped and how to
    resume (exit 2), no traceback, and nothing of the run left running (Spark's JVM included)."""
    from helpers import processes_with_env

    # 1,500 records a day: the data path alone takes over a minute here (prep runs ~6-22 s in), so 20 s stop
    # it mid-way
    result = run_flywheel(
        "run",
        "--end-date",
        "2026-11-20",
        "--no-train",
        env={"FLYWHEEL_ROOT": str(tmp_path), "FLYWHEEL_AIRFLOW__RUN_TIMEOUT_S": "20"},
        timeout=400,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, (result.stdout[-2000:], result.stderr)
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: commerce_flywheel did not finish within 20 s"), lines
    assert result.stderr.strip().splitlines()[-1] == lines[0]  # before it only the tasks that ended, one line each
    assert all(
        line.split()[0] in ("ingest", "prep", "validate", "features") for line in result.stderr.splitlines()[:-1]
    )
    assert "run the same command again to resume" in lines[0] and "dags-test.log" in lines[0]
    assert " ran;" in lines[0] or "before its first task started" in lines[0]
    assert processes_with_env(f"FLYWHEEL_ROOT={tmp_path}") == []


def test_without_a_terminal_paths_and_names_are_printed_whole(tmp_path: Path) -> None:
    """Under CI or a pipe rich would cut every cell at 80 columns (`/tmp/…/gateway.key`): whole paths instead."""
    root = tmp_path / ("a-rather-long-folder-name-" * 4) / "flywheel"
    result = run_flywheel("status", env={"FLYWHEEL_ROOT": str(root), "COLUMNS": ""})
    assert result.returncode == 0, result.stderr
    key = str(root / "runs" / "gateway.key")
    assert any(key in line for line in result.stdout.splitlines()), result.stdout
    assert "…" not in result.stdout


@pytest.mark.parametrize(
    ("module", "args", "needle"),
    [
        ("pipelines.train.pod", ["--sweep-json", "{bad", "--index", "0"], "--sweep-json"),
        ("pipelines.train.pod", ["--sweep-json", '{"grid": 3}', "--index", "0"], "--sweep-json"),
        ("pipelines.prep", ["--start", "2026-13-01", "--end", "2026-11-20"], "--start/--end"),
    ],
)
def test_a_pods_bad_input_is_one_clear_line(tmp_path: Path, module: str, args: list[str], needle: str) -> None:
    """The cluster's entry points (a training pod, spark-submit's prep) as the CLI: one `error:` line, exit 2.
    (Mutation: the pod's JSON read outside the `try`: a JSONDecodeError traceback.)"""
    env = {**os.environ, "FLYWHEEL_ROOT": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], done


def test_eval_compares_version_champion_as_the_champion(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`flywheel eval --version champion` is the condition `tuned_champion` (what the evaluation compares an
    `--adapter` with), a version by number `tuned_vN`, an `--adapter dpo=...` `tuned_dpo`, a candidate
    (mutations: the label by number for both versions; the adapter's label as given)."""
    from pipelines.cli import models as cli_models
    from pipelines.registry import models as registry

    monkeypatch.setattr(registry, "alias_version", lambda settings, ref: "7" if ref == "champion" else None)
    monkeypatch.setattr(registry, "adapter_path", lambda settings, number: f"/adapters/v{number}")
    monkeypatch.setattr(registry, "prompt_style", lambda settings, number: "short")
    monkeypatch.setattr(registry, "answer_budget", lambda settings, number: 48)
    (tmp_path / "adapter_config.json").write_text("{}")
    adapters, budgets = cli_models._adapters_to_evaluate(None, [f"dpo={tmp_path}"], ["champion", "7"])
    assert [a.label for a in adapters] == ["tuned_dpo", "tuned_champion", "tuned_v7"] and budgets == [48, 48]
    assert adapters[1].path == adapters[2].path == "/adapters/v7" and adapters[0].path == str(tmp_path)
    # a folder labelled as a registered version, or two adapters under one label, is refused (mutations: either
    # check removed): the second would overwrite the first's condition in the report
    for folders, versions, needle in (
        ([f"champion={tmp_path}"], [], "names a registered version"),
        ([f"v7={tmp_path}"], [], "names a registered version"),
        ([f"dpo={tmp_path}", f"tuned_dpo={tmp_path}"], [], "both be evaluated as tuned_dpo"),
        ([], ["7", "7"], "both be evaluated as tuned_v7"),
    ):
        with pytest.raises(cli_models.UserError, match=needle):
            cli_models._adapters_to_evaluate(None, folders, versions)


def test_a_tune_result_is_kept_when_its_mlflow_run_cannot_be_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter is trained and written before its run is logged: a tracking failure is a warning and a field of
    the result, never the result lost (mutation: the call outside its try)."""
    from pipelines.cli import tune as cli_tune
    from pipelines.tune import stage

    def down(*args: object, **kwargs: object) -> str:
        raise ConnectionError("tracking server down")

    monkeypatch.setattr(stage, "log_command_run", down)
    result = {"method": "dpo", "adapter_dir": "/runs/tune/dpo-v3/adapter", "steps": 2}
    report = cli_tune._tuned_report(None, result, "3", "tiny", "dpo", "short", "")
    assert report["run_id"] is None and report["tracking_error"] == "ConnectionError: tracking server down"
    assert report["adapter_dir"] == result["adapter_dir"] and report["steps"] == 2 and report["from_version"] == "3"
