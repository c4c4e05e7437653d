"""The one bridge between the thin DAG files and `pipelines.tasks` (stdlib-only at import time, so
parsing a DAG file stays cheap)."""

from __future__ import annotations

from typing import Any


def run_task(step: str, *args: Any) -> Any:
    """Call `pipelines.tasks.<step>`; errors retrying cannot fix fail the task at once (no retries)."""
    from airflow.exceptions import AirflowFailException

    from pipelines import tasks
    from pipelines.errors import NotRetryable

    try:
        return getattr(tasks, step)(*args)
    except NotRetryable as exc:
        raise AirflowFailException(str(exc)) from exc
