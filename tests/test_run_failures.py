"""What a failed run tells its user (`pipelines.airflow_tasks`): the final failure of exactly that run, with
whether it is a data problem; and the hourly drift check before the first champion (a pass, not a failure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.airflow_tasks import RUN_TOKEN, failure_of, record_failure
from pipelines.config import load_settings


@pytest.fixture()
def reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FLYWHEEL_ROOT", str(tmp_path))
    yield load_settings().zone("reports")


def test_a_run_sees_its_own_final_failure_only(reports: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.quality.gates import QualityGateFailed

    monkeypatch.setenv(RUN_TOKEN, "run-a")
    record_failure(
        load_settings(), "validate", QualityGateFailed("quality gate failed: postgres://u:secret@h/db"), final=True
    )
    mine = failure_of(reports, "commerce_flywheel", token="run-a")
    assert mine is not None and mine["task"] == "validate" and mine["data_problem"] is True
    assert "secret" not in mine["reason"]  # a URI password never reaches the user's terminal
    assert failure_of(reports, "commerce_flywheel", token="run-b") is None  # another run's failure is not ours
    # a failure that will be retried is not recorded: the retry may pass
    # (`_run_of`: a stand-in for Airflow's task context; the real one:
    # tests/test_dag.py::test_failing_gate_stops_the_dag_before_features_and_quarantines_the_batch)
    monkeypatch.setattr(
        "pipelines.airflow_tasks._run_of",
        lambda: {"dag_id": "commerce_flywheel", "run_id": "r1", "try_number": 1, "max_tries": 2},
    )
    monkeypatch.setenv(RUN_TOKEN, "run-c")
    record_failure(load_settings(), "train", RuntimeError("flaky"), final=None)
    assert failure_of(reports, "commerce_flywheel", token="run-c") is None
    # its last try is final: recorded, by the DAG run's id too, and not a data problem (exit 1, not 2)
    # (the same stand-in for Airflow's task context)
    monkeypatch.setattr(
        "pipelines.airflow_tasks._run_of",
        lambda: {"dag_id": "commerce_flywheel", "run_id": "r1", "try_number": 3, "max_tries": 2},
    )
    record_failure(load_settings(), "train", RuntimeError("flaky"), final=None)
    last = failure_of(reports, "commerce_flywheel", run_id="r1")
    assert last is not None and last["task"] == "train" and last["data_problem"] is False


def test_the_hourly_check_passes_before_the_first_champion_and_fails_on_any_other_gap(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from pipelines import tasks
    from pipelines.config import load_settings
    from pipelines.drift import monitor

    settings = load_settings(root=str(tmp_path))

    def no_champion(*_args):
        raise monitor.NoChampion("no champion yet")

    monkeypatch.setattr(monitor, "run_monitor", no_champion)
    result = tasks.drift_check(settings, {})
    assert result["verdict"] == "no reference" and result["fire"] is False and result["alert"] is None

    def no_window(*_args):
        raise monitor.NoReference("the champion's training window has no clean records")

    monkeypatch.setattr(monitor, "run_monitor", no_window)
    with pytest.raises(monitor.NoReference, match="no clean records"):  # monitoring off would go unnoticed
        tasks.drift_check(settings, {})


@pytest.mark.parametrize("error", ["config", "runtime"])
def test_a_setting_that_cannot_work_fails_the_task_at_once(
    error: str, reports: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ConfigError (say a Triton budget that leaves no room for a prompt) fails the task without retries,
    recorded as final; any other error stays retryable."""
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines import tasks
    from pipelines.airflow_tasks import run_task
    from pipelines.config import ConfigError

    def broken(*_args):
        raise ConfigError("triton.max_new_tokens 2040 leaves 8") if error == "config" else RuntimeError("flaky")

    monkeypatch.setattr(tasks, "deploy", broken)
    # stand-in for Airflow's task context (the real one:
    # tests/test_dag.py::test_failing_gate_stops_the_dag_before_features_and_quarantines_the_batch)
    monkeypatch.setattr(
        "pipelines.airflow_tasks._run_of",
        lambda: {"dag_id": "commerce_flywheel", "run_id": "r2", "try_number": 1, "max_tries": 2},
    )  # retries left
    monkeypatch.setenv(RUN_TOKEN, "run-d")
    expected = AirflowFailException if error == "config" else RuntimeError
    with pytest.raises(expected):
        run_task("deploy", "default", {})
    recorded = failure_of(reports, "commerce_flywheel", token="run-d")
    assert (recorded is not None and "leaves 8" in recorded["reason"]) if error == "config" else recorded is None
