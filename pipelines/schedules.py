"""What runs on its own: the platform's DAGs active or paused, their schedules, next and last runs.

`flywheel up` leaves `drift_monitor` (hourly) and `commerce_flywheel` (daily at 02:00 UTC, or as soon as
the monitor emits a drift asset event) active, unless `airflow.schedules: paused` (or `flywheel up
--paused`) says otherwise. New DAGs get the setting through Airflow's own `dags_are_paused_at_creation`;
DAGs Airflow already knows get it through the REST API once they are parsed, so a root started paused
once is active again after a plain `flywheel up`. Catchup stays off: a resumed DAG runs its latest
interval, not every missed one.
"""

from __future__ import annotations

import time
from typing import Any

from pipelines.clients.airflow import AirflowRest, AirflowUnavailable
from pipelines.config import Settings

DAGS = ("commerce_flywheel", "drift_monitor")
TRIGGERS = {"scheduled": "clock", "asset_triggered": "drift asset", "manual": "manual", "backfill": "backfill"}


class UnknownDag(AirflowUnavailable):
    """A DAG name the platform does not have."""


def chosen(dag: str | None, project: str = "default") -> tuple[str, ...]:
    """The project's own DAG ids (commerce_flywheel__<project>, ...) for `dag` (a base name) or all of them."""
    from pipelines.airflow_tasks import dag_id_for

    if dag is not None and dag not in DAGS:
        raise UnknownDag(f"no DAG {dag!r}: expected one of {', '.join(DAGS)}")
    return tuple(dag_id_for(d, project) for d in ((dag,) if dag else DAGS))


def wait_parsed(rest: AirflowRest, dags: tuple[str, ...], timeout_s: float) -> None:
    """Until Airflow's DAG processor has parsed every DAG (a fresh Airflow needs a few seconds)."""
    deadline = time.monotonic() + timeout_s
    missing = list(dags)
    while True:
        known = set(rest.dags())
        missing = [d for d in dags if d not in known]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise AirflowUnavailable(
                f"Airflow has not parsed {', '.join(missing)} after {timeout_s:.0f} s: see "
                "its log (`flywheel status` names it) for an import error"
            )
        time.sleep(2)


def set_paused(
    settings: Settings, paused: bool, dag: str | None = None, timeout_s: float = 120
) -> list[dict[str, Any]]:
    """Pause or resume the platform's DAGs (or one), waiting until Airflow has parsed them."""
    from tenacity import retry, retry_if_exception, stop_after_delay, wait_fixed

    dags = chosen(dag, settings.project)
    rest = AirflowRest(settings)
    wait_parsed(rest, dags, timeout_s)
    # a busy SQLite metadata store answers a write with a 500 now and then (its audit-log insert is locked out
    # while the scheduler writes): a few tries, each bounded by the client's own timeout
    patch = retry(
        retry=retry_if_exception(lambda exc: "HTTP 5" in str(exc)),
        stop=stop_after_delay(60),
        wait=wait_fixed(3),
        reraise=True,
    )(rest.set_paused)
    for name in dags:
        if bool((rest.dag(name) or {}).get("is_paused")) != paused:  # only a change is written
            patch(name, paused)
    return describe(settings, dag, rest)


def describe(settings: Settings, dag: str | None = None, rest: AirflowRest | None = None) -> list[dict[str, Any]]:
    """Per DAG: active or paused, the schedule, the next run, the last run with its state and its trigger."""
    rest = rest or AirflowRest(settings)
    rows: list[dict[str, Any]] = []
    for name in chosen(dag, settings.project):
        info = rest.dag(name)
        if info is None:
            rows.append({"dag": name, "state": "not parsed yet", "schedule": None, "next_run": None, "last_run": None})
            continue
        runs = rest.dag_runs(name, limit=1)
        last = runs[0] if runs else None
        rows.append(
            {
                "dag": name,
                "state": "paused" if info.get("is_paused") else "active",
                "schedule": info.get("timetable_description") or info.get("timetable_summary"),
                "next_run": None
                if info.get("is_paused")
                else (info.get("next_dagrun_run_after") or info.get("next_dagrun_logical_date")),
                "last_run": None
                if last is None
                else {
                    "run_id": last.get("dag_run_id"),
                    "state": last.get("state"),
                    "trigger": TRIGGERS.get(str(last.get("run_type")), str(last.get("run_type"))),
                    "started": last.get("start_date"),
                    "ended": last.get("end_date"),
                },
            }
        )
    return rows


def one_line(row: dict[str, Any]) -> str:
    """`drift_monitor: active, every hour; next 2026-11-26T08:00:00Z; last success (clock) ...`"""
    last = row.get("last_run")
    tail = f"last {last['state']} ({last['trigger']}, started {last['started'] or '-'})" if last else "no run yet"
    nxt = f"next {row['next_run']}" if row.get("next_run") else "no next run"
    return f"{row['dag']}: {row['state']}, {row.get('schedule') or 'no schedule'}; {nxt}; {tail}"
