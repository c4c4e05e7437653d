"""drift_monitor: hourly (and on demand) drift check of the agent's latest logs against the champion's
training window; an alert emits the `flywheel_drift` asset event, which schedules commerce_flywheel.

check -> should_alert (short-circuit: only an act-level signal outside the cooldown) -> alert (asset
event with the reason, the window and the reference days) -> mark_emitted. The check records its alert
as pending; only once the alert task has succeeded (the asset event is out) does mark_emitted mark it
emitted and start the cooldown, so a failed alert never silences retraining. The cooldown lives in the
monitor's state, so two alerts in a row start one retrain, not two; commerce_flywheel's
max_active_runs=1 serializes whatever is queued.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, Metadata, Param, dag, get_current_context, task

from pipelines.airflow_tasks import dag_id_for, drift_asset_ref, projects, run_task  # stdlib-only imports

# None: this file builds every project's DAGs. In a project's own DAG bundle (`airflow.multi_team`: one Airflow
# team per project) the copy names its project here (pipelines/projects/airflow_access.py writes it).
BUNDLE_PROJECT: str | None = None


def drift_asset(project: str) -> Asset:
    """The project's drift alert: its drift_monitor emits it; it retrains that project only."""
    name, uri = drift_asset_ref(project)
    return Asset(name=name, uri=uri)


def build(project: str):
    """One project's drift monitor (`drift_monitor`, `drift_monitor__<project>`): it checks that project's
    logs against its champion and alerts its own commerce_flywheel DAG only."""
    drift = drift_asset(project)

    @dag(
        dag_id=dag_id_for("drift_monitor", project),
        schedule="@hourly",
        start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
        catchup=False,
        max_active_runs=1,
        # an hourly check must never hang the next one: a check (parse + embeddings of a day) gets 30 minutes
        default_args={"execution_timeout": timedelta(minutes=30)},
        tags=["flywheel", "drift", f"project:{project}"],
        params={
            "end_date": Param(
                None,
                type=["null", "string"],
                description="last day of the window to check (YYYY-MM-DD); default: the newest logs",
            )
        },
        doc_md=__doc__,
    )
    def drift_monitor():
        @task
        def check() -> dict:
            return run_task("drift_check", project, dict(get_current_context()["params"]))

        @task.short_circuit
        def should_alert(result: dict) -> bool:
            return bool(result["fire"])

        @task(outlets=[drift])
        def alert(result: dict, _go: bool):
            yield Metadata(drift, result["alert"])

        @task(retries=3, retry_delay=timedelta(seconds=30), execution_timeout=timedelta(minutes=5))
        def mark_emitted(result: dict) -> dict:
            return run_task("drift_alert_emitted", project, result)

        result = check()
        alert(result, should_alert(result)) >> mark_emitted(result)

    return drift_monitor()


for _project, _runs in projects(only=BUNDLE_PROJECT):
    try:
        build(_project)
    except Exception as _exc:  # noqa: BLE001 (one project's DAG failing to build never hides the others')
        import sys

        sys.stderr.write(f"flywheel: the DAG of project {_project} was not built: {_exc}\n")
