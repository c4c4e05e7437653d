"""The drift monitor: the latest window of the agent's raw logs against the champion's training window.

Both sides go through the same per-line prep function as the Spark job (`prepare_line`), so a line
the pipeline would quarantine counts as a health signal, not as drift. The reference summary (and
its embedding sample) is computed once per training window and stored; the monitor never rescans
old data. An alert names the signals that crossed their act thresholds; within the cooldown after
an alert, further alerts are recorded but not emitted (no stacked retrains).
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import asdict
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipelines.config import Settings
from pipelines.drift.signals import Summary, compare, summarize
from pipelines.errors import NotRetryable
from pipelines.storage import glob, read_json, write_json, write_text
from pipelines.window import DateWindow


class NoReference(NotRetryable):
    """There is no champion (or no training window) to compare with yet."""


def parse_window(settings: Settings, window: DateWindow) -> tuple[pd.DataFrame, dict[str, int], int]:
    """Clean rows, quarantine reasons and the line count of a window's raw logs."""
    from pipelines.prep.nodes import CLEAN_LOG_COLUMNS, prepare_line
    from pipelines.prep.pipeline import raw_files_for

    rows, reasons, lines = [], Counter(), 0
    for uri in raw_files_for(settings, window):
        path = uri.removeprefix("file://")
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    continue
                lines += 1
                row = prepare_line(line, path)
                if row["status"] == "clean":
                    rows.append({c: row.get(c) for c in CLEAN_LOG_COLUMNS if c != "dt"})
                else:
                    reasons[row["reason"]] += 1
    return pd.DataFrame(rows), dict(reasons), lines


def latest_day(settings: Settings) -> date | None:
    days = [Path(p).name.removeprefix("dt=") for p in glob(f"{settings.zone('raw')}/dt=*")]
    return max((date.fromisoformat(d) for d in days), default=None)


def reference_window(settings: Settings) -> DateWindow:
    """The champion's training window (its registry lineage)."""
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import CHAMPION, alias_version

    version = alias_version(settings, CHAMPION)
    if version is None:
        raise NoReference("no champion yet: the monitor compares traffic with the champion's training data")
    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, version).tags
    window = tags.get("flywheel.training_window")
    if not window:
        raise NoReference(f"champion v{version} records no training window")
    start, end = window.split("_")
    return DateWindow.parse(start, end)


def _reference_uri(settings: Settings, window: DateWindow) -> str:
    return f"{settings.zone('features')}/drift_reference/{window.start}_{window.end}"


def reference(settings: Settings, window: DateWindow) -> tuple[Summary, np.ndarray]:
    """The stored reference summary and embeddings of a training window (computed on first use)."""
    from pipelines.embeddings import embed

    uri = _reference_uri(settings, window)
    try:
        data = read_json(f"{uri}/summary.json")
        return Summary(**data), np.load(f"{uri.removeprefix('file://')}/embeddings.npy")
    except FileNotFoundError:
        pass
    clean, reasons, _ = parse_window(settings, window)
    summary = summarize(clean, reasons, settings.drift)
    vectors = embed(summary.texts)
    write_json(f"{uri}/summary.json", summary.to_dict())
    np.save(f"{uri.removeprefix('file://')}/embeddings.npy", vectors)
    return summary, vectors


def _state_uri(settings: Settings) -> str:
    return f"{settings.zone('reports')}/drift/state.json"


def run_monitor(settings: Settings, end: date | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Drift of the latest window; `fire` is true when a signal crossed its act threshold outside the cooldown."""
    from pipelines.embeddings import embed

    cfg = settings.drift
    now = now or datetime.now(timezone.utc)
    ref_window = reference_window(settings)
    end = end or latest_day(settings)
    if end is None:
        raise NoReference(f"no raw logs under {settings.zone('raw')}")
    window = DateWindow.ending(end, cfg.window_days)
    ref_summary, ref_vectors = reference(settings, ref_window)
    clean, reasons, lines = parse_window(settings, window)
    base = {"window": {"start": str(window.start), "end": str(window.end)}, "lines": lines,
            "reference_window": {"start": str(ref_window.start), "end": str(ref_window.end)},
            "checked_at": now.isoformat(timespec="seconds")}
    if len(clean) < cfg.min_records:
        return {**base, "verdict": "insufficient", "fire": False,
                "reason": f"{len(clean)} clean records (< drift.min_records {cfg.min_records})", "signals": []}
    current = summarize(clean, reasons, cfg, edges=ref_summary.numeric_edges)
    results = compare(ref_summary, current, cfg, (ref_vectors, embed(current.texts)))
    acting = [r for r in results if r.band == "act"]
    reason = "; ".join(f"{r.signal} {r.metric} {r.value:g}" for r in acting)
    state = _read_state(settings)
    last = datetime.fromisoformat(state["last_alert_at"]) if state.get("last_alert_at") else None
    cooling = bool(last and now - last < timedelta(hours=cfg.cooldown_hours))
    verdict = "act" if acting else ("watch" if any(r.band == "watch" for r in results) else "stable")
    fire = bool(acting) and not cooling
    if acting:
        state.setdefault("alerts", []).append({"at": base["checked_at"], "reason": reason, "emitted": fire})
        state["alerts"] = state["alerts"][-50:]
        if fire:
            state["last_alert_at"] = base["checked_at"]
        write_json(_state_uri(settings), state)
    result = {**base, "verdict": verdict, "fire": fire, "suppressed_by_cooldown": bool(acting) and cooling,
              "reason": f"drift: {reason}" if reason else "", "records": len(clean),
              "signals": [asdict(r) for r in results]}
    return write_report(settings, result, ref_summary, current)


def _read_state(settings: Settings) -> dict[str, Any]:
    try:
        return read_json(_state_uri(settings))
    except FileNotFoundError:
        return {}


def write_report(settings: Settings, result: dict[str, Any], ref: Summary, cur: Summary) -> dict[str, Any]:
    from pipelines.drift.report import render_html

    stamp = result["checked_at"].replace(":", "").replace("-", "")
    folder = f"{settings.zone('reports')}/drift/{stamp}"
    result["json_uri"], result["html_uri"] = f"{folder}/report.json", f"{folder}/report.html"
    write_json(result["json_uri"], result)
    write_text(result["html_uri"], render_html(result, ref, cur))
    write_json(f"{settings.zone('reports')}/drift/latest.json", result)
    _log_to_mlflow(settings, result, folder)
    return result


def _log_to_mlflow(settings: Settings, result: dict[str, Any], folder: str) -> None:
    """One run per check in the `drift-monitor` experiment, through the client (no process-wide active
    experiment is changed: the training and registry code in the same process keep theirs)."""
    import tempfile

    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.storage import read_bytes

    client = mlflow_client(settings)
    experiment = client.get_experiment_by_name("drift-monitor")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("drift-monitor")
    run = client.create_run(experiment_id, run_name=f"drift {result['window']['end']}",
                            tags={"flywheel.verdict": result["verdict"], "flywheel.fired": str(result["fire"])})
    run_id = run.info.run_id
    for s in result["signals"]:
        client.log_metric(run_id, f"{s['signal']}.{s['metric']}", s["value"])
    client.log_param(run_id, "window", f"{result['window']['start']}_{result['window']['end']}")
    client.log_param(run_id, "reference", f"{result['reference_window']['start']}_{result['reference_window']['end']}")
    with tempfile.TemporaryDirectory() as tmp:
        for file in ("report.json", "report.html"):
            (Path(tmp) / file).write_bytes(read_bytes(f"{folder}/{file}"))
        client.log_artifacts(run_id, tmp, "drift")
    client.set_terminated(run_id)


def alert_of(result: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """What an alert carries to the retrain run (the asset event's extra): reason, window, reference days."""
    ref = DateWindow.parse(result["reference_window"]["start"], result["reference_window"]["end"])
    return {"reason": result["reason"], "end_date": result["window"]["end"], "window_days": settings.drift.window_days,
            "checked_at": result["checked_at"], "reference_days": [d.isoformat() for d in ref.days()]}
