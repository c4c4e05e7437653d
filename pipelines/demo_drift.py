"""`flywheel demo drift`: after the demo, traffic shifts, the drift monitor alerts and the retrain runs, as the
asset event would start it; then a day like the new champion's data, on which nothing fires."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipelines.config import Settings
from pipelines.demo import DemoFailed, _dags_test, _heading, gate_decision
from pipelines.simulate.generator import Drift
from pipelines.storage import read_json, write_json


def run_drift_demo(settings: Settings, *, records: int, seed: int, console: Console) -> dict[str, object]:
    """After `flywheel demo`: holiday traffic lands -> the drift monitor alerts -> the retrain runs on the
    recent window plus a sample of the champion's -> gate -> deployment; then a day like the new
    champion's training data -> nothing fires. The monitor and the retrain run as their DAGs
    (`airflow dags test`); the retrain gets exactly the parameters the asset event would give it."""
    from pipelines.registry.models import CHAMPION, alias_version
    from pipelines.serve.deploy import live_model

    started = time.perf_counter()
    before = alias_version(settings, CHAMPION)
    if before is None or live_model(settings) is None:
        raise DemoFailed("no champion is served yet: run `make demo` (or `flywheel demo`) first")
    shift = _shift_traffic(settings, records, seed, before, console)
    env = {"FLYWHEEL_DRIFT__COOLDOWN_HOURS": "0"}  # the demo may be re-run; the cooldown is tested on its own
    alert = _monitor(settings, shift.day, env, console)
    if not alert["fire"]:
        raise DemoFailed(
            f"the monitor did not alert on {shift.kind} traffic: {alert['verdict']}; see {alert['html_uri']}"
        )
    log = _retrain(settings, alert, shift.day, console)
    after = alias_version(settings, CHAMPION)
    decision = gate_decision(settings)
    console.print(f"gate: {decision}")
    live = live_model(settings)
    console.print(f"serving: {live.name if live else 'nothing'} (champion v{after})")
    quiet = _quiet_day(settings, shift, records, seed, changed=after != before, env=env, console=console)
    table = Table(title=f"drift demo finished in {time.perf_counter() - started:.0f} s")
    table.add_column("step")
    table.add_column("result")
    for step, outcome in (
        (f"{shift.kind} day", f"{alert['verdict']}: {alert['reason']}"),
        ("drift report", alert["html_uri"]),
        ("retrain log", str(log)),
        ("champion", f"v{before} -> v{after}" if after != before else f"v{before} kept"),
        ("gate", decision),
        ("serving", live.name if live else "-"),
        ("next day (like the champion's data)", f"{quiet['verdict']}, no alert"),
        ("next day report", quiet["html_uri"]),
    ):
        table.add_row(step, str(outcome))
    console.print(table)
    return {"alert": alert, "champion_before": before, "champion_after": after, "quiet": quiet["verdict"]}


@dataclass(frozen=True)
class _Shift:
    """The day of shifted traffic the demo wrote, how it shifted, and the shift of the run before."""

    day: date
    kind: Drift
    previous_kind: Drift
    runs: int
    raw: Path


def _shift_traffic(settings: Settings, records: int, seed: int, champion: str, console: Console) -> _Shift:
    """A day of shifted traffic after the champion's window: each run of the demo shifts it a new way (a champion
    retrained on holiday traffic would not see more holiday traffic as drift): holiday, locale, tool mix, ..."""
    from pipelines.drift.monitor import latest_day, reference_window
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs

    reference = reference_window(settings)
    day = max(latest_day(settings) or reference.end, reference.end) + timedelta(days=1)
    raw = Path(settings.zone("raw").removeprefix("file://"))
    state_uri = f"{settings.zone('reports')}/drift/demo.json"
    try:
        runs = int(read_json(state_uri).get("runs", 0))
    except FileNotFoundError:
        runs = 0
    kinds = (Drift.HOLIDAY, Drift.LOCALE, Drift.TOOL_MIX, Drift.NEW_CATEGORY)
    kind, previous_kind = kinds[runs % len(kinds)], (kinds[(runs - 1) % len(kinds)] if runs else Drift.NONE)
    _heading(
        console,
        f"drift: {kind} traffic on {day} against champion v{champion} (trained on {reference.start}..{reference.end})",
    )
    write_raw_logs(
        GeneratorConfig(
            seed=seed + runs, records=records, end_date=day, bad_share=0.03, drift=kind, drift_magnitude=0.8
        ),
        raw,
    )
    write_json(state_uri, {"runs": runs + 1})
    return _Shift(day, kind, previous_kind, runs, raw)


def _retrain(settings: Settings, alert: dict[str, Any], day: date, console: Console) -> Path:
    """The retrain the alert's asset event would start: commerce_flywheel with the alert's parameters."""
    from pipelines.tasks import run_params

    params = run_params({}, [alert["alert"]])
    console.print(
        f"alert: {alert['reason']}\nretraining on {day} plus {settings.drift.retrain_reference_share:.0%} "
        f"from the champion's window (commerce_flywheel, as the asset event starts it) ..."
    )
    with console.status("commerce_flywheel: prep, gates, features, drift sweep, evaluation, gate, deploy, bench ..."):
        result = _dags_test(settings, "commerce_flywheel", params)
    log = Path(str(settings.root)) / "logs" / "demo-drift-retrain.log"
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0 or "state=success" not in result.stdout + result.stderr:
        raise DemoFailed(f"the drift retrain failed; see {log}")
    return log


def _quiet_day(
    settings: Settings, shift: _Shift, records: int, seed: int, *, changed: bool, env: dict[str, str], console: Console
) -> dict[str, Any]:
    """Traffic like the (new) champion's training data the day after: nothing should fire."""
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs

    quiet_day = shift.day + timedelta(days=1)
    write_raw_logs(
        GeneratorConfig(
            seed=seed + shift.runs + 50,
            records=records,
            end_date=quiet_day,
            bad_share=0.03,
            drift=shift.kind if changed else shift.previous_kind,
            drift_magnitude=0.8,
        ),
        shift.raw,
    )
    quiet = _monitor(settings, quiet_day, env, console)
    if quiet["fire"]:
        raise DemoFailed(f"the monitor alerted on traffic like the champion's training data; see {quiet['html_uri']}")
    return quiet


def _monitor(settings: Settings, day, env: dict[str, str], console: Console) -> dict:
    from pipelines.drift.monitor import alert_of

    with console.status(f"drift_monitor on {day} ..."):
        result = _dags_test(settings, "drift_monitor", {"end_date": day.isoformat()}, extra_env=env)
    if result.returncode != 0:
        log = Path(str(settings.root)) / "logs" / "demo-drift-monitor.log"
        log.write_text(result.stdout + result.stderr)
        raise DemoFailed(f"the drift_monitor run failed; see {log}")
    latest = read_json(f"{settings.zone('reports')}/drift/latest.json")
    console.print(
        f"drift_monitor {day}: {latest['verdict']}, alert {'emitted' if latest['fire'] else 'not emitted'}"
        f" ({latest['html_uri']})"
    )
    return {**latest, "alert": alert_of(latest, settings)}
