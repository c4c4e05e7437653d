"""The one bridge between the thin DAG files and `pipelines.tasks` (stdlib-only at import time, so
parsing a DAG file stays cheap)."""

from __future__ import annotations

from typing import Any

FAILURE_FILE = "runs/last-failure.json"  # under the reports zone: the newest failed task and why, in one line


def run_task(step: str, *args: Any) -> Any:
    """Call `pipelines.tasks.<step>`; errors retrying cannot fix fail the task at once (no retries). Any
    failure is also recorded (`FAILURE_FILE`: the task, its one-line reason, whether it is a data problem),
    so `flywheel run` can say which task failed and why without the user opening a log."""
    from airflow.sdk.exceptions import AirflowFailException

    from pipelines import tasks
    from pipelines.errors import NotRetryable

    try:
        return getattr(tasks, step)(*args)
    except NotRetryable as exc:
        record_failure(step, exc)
        raise AirflowFailException(str(exc)) from exc
    except Exception as exc:
        record_failure(step, exc)
        raise


def record_failure(step: str, exc: BaseException) -> None:
    """Best effort: a failure to record the failure never hides the failure itself."""
    from datetime import datetime, timezone

    from pipelines.config import get_settings
    from pipelines.errors import DataProblem, one_line
    from pipelines.storage import write_json

    try:
        write_json(f"{get_settings().zone('reports')}/{FAILURE_FILE}", {
            "task": step, "data_problem": isinstance(exc, DataProblem),
            "reason": " ".join(str(exc).split()) if isinstance(exc, DataProblem) else one_line(exc),
            "at": datetime.now(timezone.utc).isoformat(timespec="microseconds")})
    except Exception:  # noqa: BLE001, S110 (the task's own error is what the caller must see)
        pass


def last_failure(reports_zone: str, since: str) -> dict[str, Any] | None:
    """The failure recorded at or after `since` (ISO time), if any."""
    from pipelines.storage import read_json

    try:
        found = read_json(f"{reports_zone}/{FAILURE_FILE}")
    except (FileNotFoundError, ValueError):
        return None
    return found if str(found.get("at", "")) >= since else None
