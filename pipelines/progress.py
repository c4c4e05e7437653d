"""A run's progress, task by task: each task of a DAG run records, as it ends, its seconds and its key figure in
one line (`<reports zone>/runs/progress/<run>/<task>.json`); `make demo` and `flywheel run` print them while the
run goes (`follower`, handed to `dags_test` as its `on_wait`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

PROGRESS = "runs/progress"  # under the reports zone: per run, one record per task as it ends


def progress_uri(reports_zone: str, run: str) -> str:
    """Where the tasks of one run (its `flywheel run` token, else the DAG run's id) record themselves."""
    return f"{reports_zone}/{PROGRESS}/{run}"


def record(reports_zone: str, run: str, dag_id: str | None, step: str, seconds: float, line: str) -> None:
    """Best effort, like a task's failure record: a task of `run` that ended says so (seconds, its key figure) for
    whoever follows the run; a failure to record never fails the task."""
    from pipelines.storage import write_json

    try:
        write_json(
            f"{progress_uri(reports_zone, run)}/{step}.json",
            {
                "task": step,
                "seconds": round(seconds, 1),
                "summary": line,
                "dag_id": dag_id,
                "at": datetime.now(UTC).isoformat(timespec="microseconds"),
            },
        )
    except Exception:  # noqa: BLE001, S110 (the task's own result is what matters)
        pass


def read_progress(reports_zone: str, run: str) -> list[dict[str, Any]]:
    """The tasks of a run that have ended so far, in the order they ended."""
    from pipelines.storage import glob, read_json

    found = []
    for uri in glob(f"{progress_uri(reports_zone, run)}/*.json"):
        try:
            found.append(read_json(uri))
        except (FileNotFoundError, ValueError):
            continue  # being written
    return sorted(found, key=lambda r: str(r.get("at", "")))


def follower(reports_zone: str, run: str, emit: Any) -> Any:
    """A callback that hands `emit` each task record of the run once, as it appears (`dags_test`'s `on_wait`)."""
    seen: set[str] = set()

    def poll() -> None:
        for record in read_progress(reports_zone, run):
            if record.get("task") not in seen:
                seen.add(str(record.get("task")))
                emit(record)

    return poll


def progress_line(record: dict[str, Any]) -> str:
    """One ended task as the demo and `flywheel run` print it: name, seconds, its key figure."""
    return f"{record.get('task', '?'):<12} {float(record.get('seconds') or 0):>6.0f} s  {record.get('summary', '')}"


def _fmt(value: Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, int | float) else "n/a"


def _evaluated(result: dict[str, Any]) -> str:
    rows = {row.get("condition"): row for row in result.get("table") or []}
    row = rows.get("tuned_candidate_constrained") or rows.get("tuned_candidate") or {}
    rounds = result.get("sampling") or []
    last = rounds[-1] if rounds else {}
    return (
        f"candidate exact match {_fmt(row.get('exact_match'))} on {last.get('examples', '?')} requests; "
        f"the gate's first look: {last.get('decision', 'n/a')}"
    )


def _tuned(tune: dict[str, Any]) -> str:
    if tune.get("method") in (None, "off"):
        return "tuning off: the SFT adapter goes on"
    if tune.get("skipped"):
        return str(tune["skipped"])
    examples = tune.get("prompts") or tune.get("pairs") or tune.get("rows")
    return f"{tune['method']}: {tune.get('steps')} steps on {examples} examples"


def _signals(result: dict[str, Any]) -> str:
    """The signals tuning could learn from, as the quality report counts them (nothing when absent)."""
    sig = result.get("signals") or {}
    if not sig:
        return ""
    if sig.get("error"):
        return f"; signals not counted: {sig['error']}"
    ratings = sig.get("ratings") or {}
    by_source = (sig.get("preference_pairs") or {}).get("by_source") or {}
    training_pairs = sum(int(splits.get("train", 0)) for splits in by_source.values())
    thumbs = sig.get("thumbs") or {}
    return (
        f"; {ratings.get('up', 0)} rated up, {ratings.get('down', 0)} down, {sig.get('rewarded_prompts', 0)} "
        f"training prompts to reward, {training_pairs} training preference pairs, "
        f"{thumbs.get('train_desirable', 0)} desirable and {thumbs.get('train_undesirable', 0)} undesirable training "
        "thumbs"
    )


SUMMARIES: dict[str, Any] = {  # each task's key figure, one line (what `make demo` prints as the task ends)
    "ingest": lambda r: (
        f"{r.get('records', len(r.get('files') or []))} "
        + ("records generated" if r.get("records") is not None else "raw files landed")
    ),
    "prep": lambda r: (
        f"{r.get('clean', 0):,} examples kept of {r.get('input_records', 0):,} records "
        f"({r.get('quarantined', 0):,} quarantined, {r.get('duplicates', 0):,} duplicates)"
    ),
    "validate": lambda r: ("quality gates passed" if r.get("success") else "quality gates failed") + _signals(r),
    "features": lambda r: "features materialized for the window",
    "train": lambda r: (
        f"best variant: validation exact match {_fmt((r.get('metrics') or {}).get('val_exact_match'))}, "
        f"final training loss {_fmt((r.get('metrics') or {}).get('final_loss'), '.4f')}"
    ),
    "tune": lambda r: _tuned(r.get("tune") or {}),
    "evaluate": _evaluated,
    "register": lambda r: f"registered as version {r.get('version')}",
    "promote": lambda r: f"{'promoted' if r.get('promoted') else 'not promoted'}: {r.get('reason', '')}",
    "deploy": lambda r: f"{r.get('deployed') or r.get('live') or 'nothing'} live",
    "smoke_test": lambda r: (
        f"{r.get('live')}: {r.get('requests', 0) - r.get('errors', 0)} of {r.get('requests', 0)} "
        f"smoke requests answered, valid JSON {_fmt(r.get('valid_json'), '.0%')}"
    ),
    "benchmark": lambda r: r.get("skipped") or f"serving benchmark of {r.get('live')} written",
    "drift_check": lambda r: f"drift verdict: {r.get('verdict')}" + (" (alert)" if r.get("fire") else ""),
}


def summary(step: str, result: Any) -> str:
    """The one line a task's result is summed up in (its key figure); the step's name for an unknown shape."""
    line = SUMMARIES.get(step)
    if line is None or not isinstance(result, dict):
        return "done"
    try:
        return " ".join(str(line(result)).split())
    except (TypeError, ValueError, AttributeError):  # an unexpected shape never fails the task that made it
        return "done"
