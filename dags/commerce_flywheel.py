"""commerce_flywheel: ingest -> prep -> validate -> features -> train sweep -> evaluate -> register -> promote
-> deploy (Triton) -> smoke test -> benchmark.

Training runs where `train.runner` says: in the task itself (`local`), or as one GPU pod per sweep
variant (`kubernetes`: `train_pods` plans them, the mapped `train_variant` runs them, `train`
collects their MLflow runs). Same DAG on a laptop and on the cluster.

Thin wiring only: every task calls one function of `pipelines.tasks` (imported inside the task, so
parsing this file stays cheap). Each task replaces just its date window's outputs, so retries and
re-runs are safe. A failed quality gate fails fast (no retries) and stops the run before training.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import Asset, Param, dag, get_current_context, task
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

from pipelines.airflow_tasks import dag_id_for, drift_asset_ref, projects, run_task  # stdlib-only imports

# None: this file builds every project's DAGs. In a project's own DAG bundle (`airflow.multi_team`: one Airflow
# team per project) the copy names its project here (pipelines/projects/airflow_access.py writes it).
BUNDLE_PROJECT: str | None = None


def drift_asset(project: str) -> Asset:
    """The project's drift alert: its drift_monitor emits it; it retrains that project only."""
    name, uri = drift_asset_ref(project)
    return Asset(name=name, uri=uri)


# The `kubernetes` train runner: one pod per sweep variant, planned by `train_pods` (none locally,
# so `train_variant` is skipped). Cluster credentials come from the Airflow connection.
TRAIN_POD_ARGS = {
    "kubernetes_conn_id": "kubernetes_default",
    "get_logs": True,
    "on_finish_action": "delete_succeeded_pod",
    "startup_timeout_seconds": 1800,  # a GPU node may have to scale up and pull the NeMo image first
    "reattach_on_restart": True,
    "retries": 1,
    "execution_timeout": timedelta(hours=12),
}

DEFAULT_ARGS = {
    "retries": 2,
    "retry_delay": timedelta(seconds=20),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
    # no task may hang a run: a stuck one fails (and retries) after this; training has its own, longer limit
    "execution_timeout": timedelta(hours=2),
}
TRAIN_TIMEOUT = timedelta(hours=12)  # a whole sweep on the CPU, or collecting the GPU pods' runs


def build(project: str, training_runs: int):
    """One project's DAG: `commerce_flywheel` for `default`, `commerce_flywheel__<project>` for each other AI
    project. Its tasks work in that project (`run_task` builds that project's settings and passes them); a
    project's runs never queue behind another project's (each DAG has its own `max_active_runs`)."""

    @dag(
        dag_id=dag_id_for("commerce_flywheel", project),
        # daily, and whenever the project's drift monitor raises an alert (the run retrains on the drifted window)
        schedule=AssetOrTimeSchedule(
            timetable=CronTriggerTimetable("0 2 * * *", timezone="UTC"), assets=[drift_asset(project)]
        ),
        start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
        catchup=False,
        max_active_runs=training_runs,  # the project's quota of concurrent training runs
        default_args=DEFAULT_ARGS,
        tags=["flywheel", f"project:{project}"],
        params={
            "end_date": Param(
                None,
                type=["null", "string"],
                description="Last day of the window (YYYY-MM-DD); default: the last complete day",
            ),
            "window_days": Param(1, type="integer", minimum=1, maximum=90),
            "source": Param(
                "synthetic" if project == "default" else "landed",
                enum=["synthetic", "landed"],
                description="synthetic: generate traffic for the window (the default project's demo); "
                "landed: use the agent's logs (a project's default: its own logs only)",
            ),
            "records_per_day": Param(1500, type="integer", minimum=1),
            "seed": Param(0, type="integer", description="0: derived from the date"),
            "bad_share": Param(0.05, type="number", minimum=0, maximum=1),
            "drift": Param("none", enum=["none", "holiday", "new-category", "locale", "tool-mix"]),
            "drift_magnitude": Param(0.6, type="number", minimum=0, maximum=1),
            "sweep": Param(None, type=["null", "string"], description="sweep file; default: train.sweep in the config"),
            "train": Param(True, type="boolean", description="false: stop after the training set is built"),
            "deploy": Param(True, type="boolean", description="false: stop after promotion (no Triton)"),
            "reference_days": Param(
                None,
                type=["null", "array"],
                description="drift retrain: days of the champion's "
                "training window to mix in (set from the drift alert)",
            ),
            "drift_alerts": Param(0, type="integer", minimum=0, description="drift alerts this run serves"),
            "reason": Param(
                None, type=["null", "string"], description="why this run retrains (recorded with the model)"
            ),
        },
        doc_md=__doc__,
    )
    def commerce_flywheel():
        @task
        def params() -> dict:
            """The run's params; a drift-triggered run takes its window, reason and reference from the alert."""
            from pipelines.tasks import run_params

            context = get_current_context()
            events = [
                dict(e.extra or {})
                for key, evs in (context.get("triggering_asset_events") or {}).items()
                for e in evs
                if "drift" in str(key)
            ]
            return run_params(dict(context["params"]), events)

        @task
        def window(p: dict) -> dict:
            from pipelines.tasks import resolve_window

            return resolve_window(p, get_current_context()["dag_run"].run_after)

        @task
        def ingest(win: dict, p: dict) -> dict:
            return run_task("ingest", project, win, p)

        @task
        def prep(win: dict, _ingested: dict) -> dict:
            return run_task("prep", project, win)

        @task
        def validate(win: dict, _prepared: dict, p: dict) -> dict:
            return run_task("validate", project, win, p)  # p: the sweep the run trains sizes the prompt ceiling

        @task
        def features(win: dict, _validated: dict) -> dict:
            return run_task("features", project, win)

        @task.short_circuit
        def should_train(_features: dict, p: dict) -> bool:
            return bool(p.get("train", True))

        @task
        def train_pods(_go: bool, p: dict, win: dict) -> list:
            return run_task("train_pods", project, {**p, "window": win})

        # a killed sweep resumes from its checkpoints on retry; after pods, it collects their runs
        @task(retries=3, trigger_rule="none_failed", execution_timeout=TRAIN_TIMEOUT)
        def train(p: dict, win: dict) -> dict:
            return run_task("train", project, {**p, "window": win})  # the training set of this run's window

        # the project's tuning after SFT (off: the sweep's adapter goes on); a retry returns the finished run
        @task(retries=2, execution_timeout=TRAIN_TIMEOUT)
        def tune(trained: dict) -> dict:
            return run_task("tune", project, trained)

        @task
        def evaluate(trained: dict) -> dict:
            return run_task("evaluate", project, trained)

        @task
        def register(trained: dict, evaluated: dict) -> dict:
            return run_task("register", project, trained, evaluated)

        @task
        def promote(registered: dict, evaluated: dict, p: dict) -> dict:
            return run_task("promote", project, registered, evaluated, p)

        @task.short_circuit
        def should_deploy(promoted: dict, p: dict) -> bool:
            return run_task("should_deploy", project, promoted, p)

        @task
        def deploy(_go: bool, promoted: dict) -> dict:
            return run_task("deploy", project, promoted)

        @task
        def smoke_test(deployed: dict) -> dict:
            return run_task("smoke_test", project, deployed)

        @task
        def benchmark(smoked: dict) -> dict:
            return run_task("benchmark", project, smoked)

        p = params()
        win = window(p)
        built = features(win, validate(win, prep(win, ingest(win, p)), p))
        go = should_train(built, p)
        pods = KubernetesPodOperator.partial(task_id="train_variant", **TRAIN_POD_ARGS).expand(
            pod_template_dict=train_pods(go, p, win)
        )
        swept = train(p, win)
        pods >> swept
        trained = tune(swept)
        evaluated = evaluate(trained)
        promoted = promote(register(trained, evaluated), evaluated, p)
        benchmark(smoke_test(deploy(should_deploy(promoted, p), promoted)))

    return commerce_flywheel()


for _project, _runs in projects(only=BUNDLE_PROJECT):
    try:
        build(_project, _runs)
    except Exception as _exc:  # noqa: BLE001 (one project's DAG failing to build never hides the others')
        import sys

        sys.stderr.write(f"flywheel: the DAG of project {_project} was not built: {_exc}\n")
