"""The drift monitor: the latest window of the agent's raw logs against the champion's training window.

Both sides go through the same per-line prep function as the Spark job (`prepare_line`, with our
catalogue plus every registered toolset), so a line the pipeline would quarantine counts as a health
signal, not as drift. The reference summary (and its embedding sample) is computed once per training
window and stored; the monitor never rescans old data. Every read and write goes through fsspec, so
the zones may be local folders or object storage.

An alert names the signals that crossed their act thresholds. `run_monitor` records it as pending;
the DAG marks it emitted (`mark_emitted`) once the asset event is out, and only an emitted alert
starts the cooldown, within which further alerts are recorded but not emitted (no stacked retrains).
The state file is read-modify-written under a file lock.
"""

from __future__ import annotations

import io
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pandas as pd

from pipelines.config import Settings
from pipelines.drift.signals import Summary, compare, summarize
from pipelines.errors import DataProblem
from pipelines.storage import glob, lock_file, read_bytes, read_json, write_bytes, write_json, write_text
from pipelines.window import DateWindow


class NoReference(DataProblem):
    """There is no champion (or no training window, or no clean record in it) to compare with yet."""


class NoChampion(NoReference):
    """Nothing is served yet: an hourly check before the first promotion passes and says so."""


class StateLockTimeout(TimeoutError):
    """Another check or alert held the monitor's state lock too long (retryable)."""


def _parse_lines(
    lines: list[str], source: str, tools: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], Counter[str], int]:
    """Clean rows, quarantine reasons and the non-blank line count of a chunk of raw lines."""
    from pipelines.logs.schema import TEACHER_COPY_SUFFIX
    from pipelines.prep.nodes import CLEAN_LOG_COLUMNS, prepare_line

    columns = [c for c in CLEAN_LOG_COLUMNS if c != "dt"]
    rows: list[dict[str, Any]] = []
    reasons: Counter[str] = Counter()
    count = 0
    for line in lines:
        if not line.strip():
            continue
        count += 1
        row = prepare_line(line, source, tools)
        if str(row.get("record_id") or "").endswith(TEACHER_COPY_SUFFIX):
            continue  # a canary's teacher copy (clean or not): a second answer to a request already counted
        if row["status"] == "clean":
            rows.append({c: row.get(c) for c in columns})
        else:
            reasons[row["reason"]] += 1
    return rows, reasons, count


def _chunks(files: list[str], size: int) -> Iterator[tuple[list[str], str]]:
    """The window's raw lines in chunks of `size`, each with its source file (fsspec: local paths and
    s3:// alike; `.gz` is decompressed on the fly)."""
    for uri in files:
        source = uri.removeprefix("file://")
        with fsspec.open(uri, "rt", compression="infer", encoding="utf-8") as handle:
            chunk: list[str] = []
            for line in handle:
                chunk.append(line)
                if len(chunk) >= size:
                    yield chunk, source
                    chunk = []
            if chunk:
                yield chunk, source


def _parse_workers(cfg: Any) -> int:
    if cfg.parse_workers:
        return cfg.parse_workers
    import psutil

    return max(1, min(8, psutil.cpu_count(logical=False) or 1))


def parse_window(settings: Settings, window: DateWindow) -> tuple[pd.DataFrame, dict[str, int], int]:
    """Clean rows, quarantine reasons and the line count of a window's raw logs (an empty window: a frame with the
    summary's columns and no rows). Lines go through `prepare_line` with our catalogue plus every registered
    toolset, as in prep. Each file's parse is kept (`drift.parsed`, keyed by its content hash), so a check parses
    only the files that arrived or changed since the last (`drift.parse_cache`); the new lines of more than one
    chunk (`drift.parse_chunk_lines`) are parsed by a process pool, in order. A `.gz` file that cannot be
    decompressed whole (corrupt, truncated) is skipped, as in prep, and counted under the reason
    `unreadable_file` (files, not lines); the parse goes on."""
    from pipelines.drift.parsed import COLUMNS, ParseCache
    from pipelines.logs.toolsets import registered_catalogue

    cfg = settings.drift
    tools = registered_catalogue(settings.zone("raw"))
    files, unreadable = _readable(settings, window)
    cache = ParseCache(settings, tools) if cfg.parse_cache else None
    keys = {uri: cache.key(uri) for uri in files} if cache else {}
    kept = {uri: cache.load(keys[uri]) for uri in files} if cache else {}
    new = [uri for uri in files if kept.get(uri) is None]
    parsed = _parse_files(new, tools, cfg)
    frames: list[pd.DataFrame] = []
    reasons: Counter[str] = Counter()
    lines = 0
    for uri in files:
        found = kept.get(uri)
        if found is None:
            rows, file_reasons, count = parsed[uri]
            frame = cache.store(keys[uri], rows, file_reasons, count) if cache else _frame(rows)
            found = (frame, file_reasons, count)
        frames.append(found[0])
        reasons.update(found[1])
        lines += found[2]
    if cache:
        cache.save_index(files)
        cache.prune()
    if unreadable:
        reasons["unreadable_file"] += unreadable
    clean = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS))
    return clean, dict(reasons), lines


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    from pipelines.drift.parsed import COLUMNS

    return pd.DataFrame([{c: r.get(c) for c in COLUMNS} for r in rows], columns=list(COLUMNS))


def _readable(settings: Settings, window: DateWindow) -> tuple[list[str], int]:
    """The window's raw files that decompress whole, and how many do not (each logged)."""
    import logging

    from pipelines.logs.raw import unreadable_reason
    from pipelines.prep.pipeline import raw_files_for

    files, unreadable = [], 0
    for uri in raw_files_for(settings, window, late_copies=False):  # the days' traffic, not late copies
        reason = unreadable_reason(uri)
        if reason:
            unreadable += 1
            logging.getLogger(__name__).warning("drift monitor: skipping unreadable raw file %s: %s", uri, reason)
        else:
            files.append(uri)
    return files, unreadable


def _parse_files(
    files: list[str], tools: dict[str, dict[str, Any]], cfg: Any
) -> dict[str, tuple[list[dict[str, Any]], Counter[str], int]]:
    """Each file's clean rows, reasons and line count, its chunks parsed in order (a pool past the first chunk)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    out: dict[str, tuple[list[dict[str, Any]], Counter[str], int]] = {}

    def add(source: str, part: tuple[list[dict[str, Any]], Counter[str], int]) -> None:
        rows, reasons, count = out.setdefault(source, ([], Counter(), 0))
        rows.extend(part[0])
        reasons.update(part[1])
        out[source] = (rows, reasons, count + part[2])

    chunks = _chunks(files, cfg.parse_chunk_lines)
    first = next(chunks, None)
    if first is not None:
        add(first[1], _parse_lines(*first, tools))  # a small window never starts a pool
    workers = _parse_workers(cfg)
    if workers <= 1:
        for chunk, source in chunks:
            add(source, _parse_lines(chunk, source, tools))
    else:
        # spawn, not fork: the caller may hold threads (torch, an Airflow task's supervisor connection)
        pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
        try:
            pending: deque = deque()
            for chunk, source in chunks:
                pending.append((source, pool.submit(_parse_lines, chunk, source, tools)))
                if len(pending) >= 2 * workers:  # bounded memory: a few chunks in flight
                    source_done, future = pending.popleft()
                    add(source_done, future.result(timeout=cfg.parse_timeout_s))
            while pending:
                source_done, future = pending.popleft()
                add(source_done, future.result(timeout=cfg.parse_timeout_s))
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)  # every future is done: the workers only have to exit
    return {uri: out.get(uri.removeprefix("file://"), ([], Counter(), 0)) for uri in files}


def latest_day(settings: Settings) -> date | None:
    days = [Path(p).name.removeprefix("dt=") for p in glob(f"{settings.zone('raw')}/dt=*")]
    return max((date.fromisoformat(d) for d in days), default=None)


def reference_window(settings: Settings) -> DateWindow:
    """The champion's training window (its registry lineage)."""
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import CHAMPION, alias_version

    version = alias_version(settings, CHAMPION)
    if version is None:
        raise NoChampion("no champion yet: the monitor compares traffic with the champion's training data")
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
        return Summary(**data), np.load(io.BytesIO(read_bytes(f"{uri}/embeddings.npy")), allow_pickle=False)
    except FileNotFoundError:
        pass
    clean, reasons, lines = parse_window(settings, window)
    if clean.empty:
        raise NoReference(
            f"the champion's training window {window} has no clean records under "
            f"{settings.zone('raw')} ({lines} lines): nothing to compare with"
        )
    summary = summarize(clean, reasons, settings.drift)
    vectors = embed(summary.texts)
    buffer = io.BytesIO()
    np.save(buffer, vectors, allow_pickle=False)
    write_bytes(f"{uri}/embeddings.npy", buffer.getvalue())  # first: a summary.json implies its embeddings
    write_json(f"{uri}/summary.json", summary.to_dict())
    return summary, vectors


def _state_uri(settings: Settings) -> str:
    return f"{settings.zone('reports')}/drift/state.json"


def _lock_path(settings: Settings) -> Path:
    """The state's lock file (`storage.lock_file`: beside it locally, under ~/.flywheel/locks for object storage)."""
    return Path(lock_file(_state_uri(settings)))


@contextmanager
def _locked_state(settings: Settings) -> Iterator[dict[str, Any]]:
    """The state under its lock (a file lock locally; on object storage the advisory lock every host shares,
    `locks.shared_lock`); written back (atomically) when the block ends without an error."""
    from contextlib import ExitStack

    from pipelines.locks import shared_lock
    from pipelines.storage import Busy

    timeout = settings.drift.state_lock_timeout_s
    held = ExitStack()
    try:
        held.enter_context(shared_lock(_state_uri(settings), timeout, "the drift state", settings.state_lock_uri))
    except Busy:
        raise StateLockTimeout(
            f"the drift monitor's state lock was held for more than {timeout:g} s (another check or alert); retry"
        ) from None
    with held:
        state = _read_state(settings)
        yield state
        write_json(_state_uri(settings), state)


def _cooling(state: dict[str, Any], now: datetime, hours: float) -> bool:
    """Within the cooldown of the last *emitted* alert (a pending one never silences a check)."""
    last = datetime.fromisoformat(state["last_alert_at"]) if state.get("last_alert_at") else None
    return bool(last and now - last < timedelta(hours=hours))


def run_monitor(settings: Settings, end: date | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Drift of the latest window; `fire` is true when a signal crossed its act threshold outside the
    cooldown. A firing check records a pending alert; `mark_emitted` starts the cooldown."""
    from pipelines.embeddings import embed

    cfg = settings.drift
    now = now or datetime.now(UTC)
    ref_window = reference_window(settings)
    end = end or latest_day(settings)
    if end is None:
        raise NoReference(f"no raw logs under {settings.zone('raw')}")
    window = DateWindow.ending(end, cfg.window_days)
    ref_summary, ref_vectors = reference(settings, ref_window)
    clean, reasons, lines = parse_window(settings, window)
    base = {
        "window": {"start": str(window.start), "end": str(window.end)},
        "lines": lines,
        "reference_window": {"start": str(ref_window.start), "end": str(ref_window.end)},
        "checked_at": now.isoformat(timespec="seconds"),
    }
    if len(clean) < cfg.min_records:
        return {
            **base,
            "verdict": "insufficient",
            "fire": False,
            "reason": f"{len(clean)} clean records (< drift.min_records {cfg.min_records})",
            "signals": [],
        }
    current = summarize(clean, reasons, cfg, edges=ref_summary.numeric_edges)
    results = compare(ref_summary, current, cfg, (ref_vectors, embed(current.texts)))
    acting = [r for r in results if r.band == "act"]
    reason = "; ".join(f"{r.signal} {r.metric} {r.value:g}" for r in acting)
    verdict = "act" if acting else ("watch" if any(r.band == "watch" for r in results) else "stable")
    cooling = fire = False
    if acting:
        with _locked_state(settings) as state:
            cooling = _cooling(state, now, cfg.cooldown_hours)
            fire = not cooling
            state.setdefault("alerts", []).append(
                {
                    "at": base["checked_at"],
                    "reason": reason,
                    "fire": fire,
                    "emitted": False,
                    "suppressed_by_cooldown": cooling,
                }
            )
            state["alerts"] = state["alerts"][-50:]
    result = {
        **base,
        "verdict": verdict,
        "fire": fire,
        "suppressed_by_cooldown": cooling,
        "reason": f"drift: {reason}" if reason else "",
        "records": len(clean),
        "signals": [asdict(r) for r in results],
    }
    return write_report(settings, result, ref_summary, current)


def mark_emitted(settings: Settings, checked_at: str, emitted_at: datetime | None = None) -> dict[str, Any]:
    """The alert of the check at `checked_at` went out (its asset event was emitted): mark it, and start
    the cooldown from that check. Idempotent (a retried task marks the same alert again)."""
    emitted_at = emitted_at or datetime.now(UTC)
    with _locked_state(settings) as state:
        alerts = state.setdefault("alerts", [])
        alert = next((a for a in reversed(alerts) if a.get("at") == checked_at), None)
        if alert is None:  # the state was lost or trimmed: the emission still starts the cooldown
            alert = {"at": checked_at, "reason": "", "fire": True, "suppressed_by_cooldown": False}
            alerts.append(alert)
            state["alerts"] = alerts[-50:]
        alert.update(emitted=True, emitted_at=emitted_at.isoformat(timespec="seconds"))
        last = state.get("last_alert_at")
        if not last or datetime.fromisoformat(last) < datetime.fromisoformat(checked_at):
            state["last_alert_at"] = checked_at
        return dict(alert)


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

    from pipelines.clients.mlflow import artifact_location
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.storage import read_bytes

    client = mlflow_client(settings)
    experiment = client.get_experiment_by_name("drift-monitor")
    experiment_id = (
        experiment.experiment_id
        if experiment
        else client.create_experiment("drift-monitor", artifact_location=artifact_location(settings, "drift-monitor"))
    )
    run = client.create_run(
        experiment_id,
        run_name=f"drift {result['window']['end']}",
        tags={"flywheel.verdict": result["verdict"], "flywheel.fired": str(result["fire"])},
    )
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
    return {
        "reason": result["reason"],
        "end_date": result["window"]["end"],
        "window_days": settings.drift.window_days,
        "checked_at": result["checked_at"],
        "reference_days": [d.isoformat() for d in ref.days()],
    }
