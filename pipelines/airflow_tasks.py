"""The one bridge between the thin DAG files and `pipelines.tasks` (stdlib-only at import time, so
parsing a DAG file stays cheap)."""

from __future__ import annotations

import os
import time
from datetime import UTC
from typing import Any

PROJECT_PATTERN = r"^[a-z][a-z0-9_]{1,30}$"  # = pipelines.config.PROJECT_PATTERN (kept stdlib-only here)
PROJECT_SEP = "__"  # commerce_flywheel__<project>: one DAG per AI project (the `default` project's has no suffix)
DEFAULT_PROJECT = "default"  # = pipelines.config.DEFAULT_PROJECT (kept stdlib-only here)
FAILURES = "runs/failures"  # under the reports zone: per DAG, its newest final task failure and why, in one line
RUN_TOKEN = "FLYWHEEL_RUN_TOKEN"  # noqa: S105 (a name: `flywheel run` sets it for its `dags test`, the record names its run)


PURE = ("should_deploy",)  # tasks that read no settings: decided from their inputs alone


def task_settings(project: str) -> Any:
    """The settings a task of `project`'s DAG runs with: the worker's configuration (its FLYWHEEL_* environment
    and FLYWHEEL_CONFIG file, read by the settings loader) in that project. Built per task, passed down."""
    from pipelines.config import load_settings

    return load_settings(project=project)


def run_task(step: str, project: str, *args: Any) -> Any:
    """Call `pipelines.tasks.<step>(settings, *args)` with `project`'s settings (the DAG that calls it names its
    project); errors retrying cannot fix (NotRetryable, ConfigError) fail the task at once (no retries). A task's
    final failure (no retry left, or not retryable) is also recorded (`FAILURES`: the task, its one-line
    reason, whether it is a data problem, the DAG run), so `flywheel run` can say which task failed and why."""
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines import progress, tasks
    from pipelines.config import ConfigError
    from pipelines.errors import NotRetryable

    settings = None
    try:
        if step in PURE:
            return getattr(tasks, step)(*args)
        settings = task_settings(project)
        started = time.perf_counter()
        result = getattr(tasks, step)(settings, *args)
        run = _run_of()
        key = os.environ.get(RUN_TOKEN) or str(run.get("run_id") or "")  # `flywheel run`'s token, else the run
        if key:
            seconds, line = time.perf_counter() - started, progress.summary(step, result)
            progress.record(settings.zone("reports"), key, run.get("dag_id"), step, seconds, line)
        return result
    except (NotRetryable, ConfigError) as exc:  # a setting that cannot work is not fixed by retrying either
        record_failure(settings, step, exc, final=True)
        raise AirflowFailException(str(exc)) from exc
    except BaseException as exc:  # a timeout is a BaseException: recorded too, then raised as it was
        record_failure(settings, step, exc, final=None)
        raise


def dag_id_for(base: str, project: str) -> str:
    return base if project == DEFAULT_PROJECT else f"{base}{PROJECT_SEP}{project}"


def drift_asset_ref(project: str) -> tuple[str, str]:
    """(name, uri) of a project's drift alert asset: its drift_monitor emits it, its commerce_flywheel runs on it."""
    if project == DEFAULT_PROJECT:
        return "flywheel_drift", "flywheel://drift/alerts"
    return f"flywheel_drift{PROJECT_SEP}{project}", f"flywheel://drift/{project}/alerts"


def project_of(dag_id: str) -> str:
    return dag_id.split(PROJECT_SEP, 1)[1] if PROJECT_SEP in dag_id else DEFAULT_PROJECT


def projects(only: str | None = None) -> list[tuple[str, int]]:
    """(project, its concurrent training runs) for `default` and every project in the registry at
    $FLYWHEEL_ROOT/projects/registry.json (what Airflow's DAG files generate a DAG each for; read with the
    standard library, or fsspec for an object-store root). A registry that cannot be read yields `default`
    only, and says so on stderr (the DAG processor's log). `only`: that project alone (a multi-team DAG
    bundle's), or nothing when it is no project (deleted)."""
    if only is not None:
        return [p for p in projects() if p[0] == only]
    import json
    import sys

    out = [(DEFAULT_PROJECT, 1)]
    root = os.environ.get("FLYWHEEL_ROOT")
    if not root:
        return out
    uri = f"{root.rstrip('/')}/projects/registry.json"
    try:
        if "://" in uri and not uri.startswith("file://"):
            import fsspec

            with fsspec.open(uri, "rb") as fh:
                data = json.load(fh)
        else:
            with open(uri.removeprefix("file://"), "rb") as fh:
                data = json.load(fh)
    except FileNotFoundError:
        return out
    except Exception as exc:  # noqa: BLE001 (a broken registry must not hide the default project's DAGs)
        sys.stderr.write(f"flywheel: the project registry {uri} could not be read ({type(exc).__name__}: {exc})\n")
        return out
    import re

    found = []
    for name, project in sorted((data.get("projects") or {}).items()):
        try:
            runs = int((project.get("quotas") or {}).get("training_runs") or 1)
            if not re.fullmatch(PROJECT_PATTERN, name) or not 1 <= runs <= 64:
                raise ValueError(f"not a project name {name!r} or training_runs {runs}")
        except (TypeError, ValueError, AttributeError) as exc:  # a hand-edited entry: skipped, said, never fatal
            sys.stderr.write(f"flywheel: project {name!r} skipped in {uri}: {exc}\n")
            continue
        found.append((name, runs))
    return ([(n, r) for n, r in found if n == DEFAULT_PROJECT] or out) + [
        (n, r) for n, r in found if n != DEFAULT_PROJECT
    ]


def _run_of() -> dict[str, Any]:
    """This task's DAG run and try (empty outside Airflow)."""
    try:
        from airflow.sdk import get_current_context

        ti = get_current_context()["ti"]
        return {
            "dag_id": ti.dag_id,
            "run_id": ti.run_id,
            "try_number": ti.try_number,
            "max_tries": getattr(ti, "max_tries", None),
        }
    except Exception:  # noqa: BLE001 (called outside a task)
        return {}


def record_failure(settings: Any, step: str, exc: BaseException, final: bool | None) -> None:
    """Best effort: a failure to record the failure never hides the failure itself. `final` None: final when no
    retry is left. `settings` None (they did not load): the platform's, from the worker's configuration."""
    from datetime import datetime

    from pipelines.config import DEFAULT_PROJECT as PLATFORM
    from pipelines.config import load_settings
    from pipelines.errors import DataProblem, one_line
    from pipelines.security import mask_uri_passwords
    from pipelines.storage import write_json

    try:
        run = _run_of()
        if final is None:
            tries, most = run.get("try_number"), run.get("max_tries")
            final = not (isinstance(tries, int) and isinstance(most, int) and tries <= most)
        if not final:
            return
        reason = " ".join(str(exc).split()) if isinstance(exc, DataProblem) else one_line(exc)
        settings = settings or load_settings(project=PLATFORM)
        write_json(
            f"{settings.zone('reports')}/{FAILURES}/{run.get('dag_id', 'commerce_flywheel')}.json",
            {
                "task": step,
                "data_problem": isinstance(exc, DataProblem),
                "reason": mask_uri_passwords(reason),
                "dag_id": run.get("dag_id"),
                "run_id": run.get("run_id"),
                "token": os.environ.get(RUN_TOKEN),
                "at": datetime.now(UTC).isoformat(timespec="microseconds"),
            },
        )
    except Exception:  # noqa: BLE001, S110 (the task's own error is what the caller must see)
        pass


def failure_of(
    reports_zone: str, dag_id: str, *, token: str | None = None, run_id: str | None = None
) -> dict[str, Any] | None:
    """The recorded final failure of exactly this run (by `flywheel run`'s token or the DAG run's id), if any."""
    from pipelines.storage import read_json

    try:
        found = read_json(f"{reports_zone}/{FAILURES}/{dag_id}.json")
    except (FileNotFoundError, ValueError):
        return None
    if (token is not None and found.get("token") == token) or (run_id is not None and found.get("run_id") == run_id):
        return found
    return None
