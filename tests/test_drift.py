"""Drift metrics against hand-computed answers, and the monitor on generated traffic (no drift vs
holiday drift), with its report, cooldown and the stored reference summary."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from pipelines.config import load_settings
from pipelines.drift import metrics


def test_identical_distributions_drift_zero() -> None:
    counts = np.array([30.0, 50.0, 20.0])
    assert metrics.psi(counts, counts) == pytest.approx(0.0, abs=1e-12)
    assert metrics.js_distance(counts, counts * 3) == pytest.approx(0.0, abs=1e-7)
    values = np.arange(1.0, 101.0)
    edges = metrics.quantile_edges(values, 10)
    assert len(edges) == 9 and metrics.binned_counts(values, edges).tolist() == [10.0] * 10
    assert metrics.wasserstein(values, values) == 0.0
    sample = np.random.default_rng(0).normal(size=(40, 8))
    assert metrics.mmd_rbf(sample, sample) == pytest.approx(0.0, abs=1e-12)


def test_shifted_distributions_give_the_hand_computed_values() -> None:
    # PSI: (0.9-0.5) ln(0.9/0.5) + (0.1-0.5) ln(0.1/0.5) = 0.4 ln 1.8 + 0.4 ln 5
    assert metrics.psi([50, 50], [90, 10]) == pytest.approx(0.4 * math.log(1.8) + 0.4 * math.log(5), rel=1e-3)
    # JS distance (base 2): disjoint supports -> 1; [.5,.5] vs [1,0] -> sqrt((0.2075 + 0.4150) / 2)
    assert metrics.js_distance([1, 0], [0, 1]) == pytest.approx(1.0)
    expected = math.sqrt((0.5 * math.log2(0.5 / 0.75) + 0.5 * math.log2(2) + math.log2(1 / 0.75)) / 2)
    assert metrics.js_distance([1, 1], [1, 0]) == pytest.approx(expected)
    assert metrics.wasserstein([0, 1, 3], [5, 6, 8]) == pytest.approx(5.0)
    # a category the reference never saw counts (floored), instead of dividing by zero
    r, c = metrics.aligned({"a": 100}, {"a": 50, "b": 50})
    assert r.tolist() == [100.0, 0.0] and metrics.psi(r, c) > 1.0
    assert [metrics.band(v, 0.1, 0.25) for v in (0.05, 0.1, 0.3)] == ["stable", "watch", "act"]


def test_embedding_drift_separates_shifted_clusters_only() -> None:
    rng = np.random.default_rng(1)
    ref, same = rng.normal(size=(120, 16)), rng.normal(size=(120, 16))
    shifted = rng.normal(size=(120, 16)) + 1.5
    assert metrics.classifier_auc(ref, same) < 0.65
    assert metrics.classifier_auc(ref, shifted) > 0.95
    assert metrics.mmd_rbf(ref, shifted) > 10 * abs(metrics.mmd_rbf(ref, same))


def million_rows(n: int, seed: int):
    import pandas as pd

    rng = np.random.default_rng(seed)
    texts = np.array(["where is my order", "red running shoes", "cancel my subscription", "gift ideas", ""])
    amounts = rng.lognormal(4, 1, n)
    amounts[rng.random(n) < 0.9] = np.nan  # amounts appear in a minority of requests
    return pd.DataFrame(
        {
            "tool": rng.choice(np.array(["search_products", "get_order", "track_shipment", "create_invoice"]), n),
            "workload_id": rng.choice(np.array(["search", "orders", "billing"]), n),
            "country": rng.choice(np.array(["US", "DE", "GB", "IN"]), n),
            "currency": rng.choice(np.array(["USD", "EUR", "GBP", "INR"]), n),
            "channel": rng.choice(np.array(["web", "app"]), n),
            "category": rng.choice(np.array(["toys", "home", "books", None], dtype=object), n),
            "request_text": rng.choice(texts, n),
            "latency_ms": rng.lognormal(7, 0.4, n),
            "amount": amounts,
            "feedback": rng.choice(np.array(["none", "up", "down"]), n, p=[0.7, 0.2, 0.1]),
        }
    )


def test_a_million_records_summarize_in_seconds() -> None:
    """`summarize` (what the monitor runs on each window) on 1,000,000 rows: every row is counted once."""
    import time

    from pipelines.drift.signals import compare, summarize

    cfg = load_settings().drift
    n = 1_000_000
    rows = million_rows(n, 2)
    started = time.perf_counter()
    ref = summarize(rows, {"unknown_tool": 10}, cfg)
    seconds = time.perf_counter() - started
    assert ref.records == n
    for column, counts in ref.categorical.items():
        assert sum(counts.values()) == n, column
    assert ref.categorical["category"]["(none)"] > 0  # missing categories are counted, not dropped
    assert sum(ref.numeric_counts["latency_ms"]) == n and sum(ref.numeric_counts["request_length"]) == n
    assert sum(ref.numeric_counts["amount"]) == int(rows["amount"].notna().sum())
    assert ref.health["invalid_tool_call_rate"] == pytest.approx(10 / (n + 10))
    # the same traffic against itself: no drift (and the comparison runs on the summaries only)
    same = compare(ref, summarize(million_rows(n, 3), {}, cfg, edges=ref.numeric_edges), cfg)
    assert {r.band for r in same if r.kind != "health"} == {"stable"}, same
    assert seconds < 30  # generous: a busy CI machine (about 2 s on a laptop core)


@pytest.fixture
def traffic_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Reference week, then a normal day and a holiday-drift day, as raw logs; the champion's
    training window is the reference week."""
    from pipelines.drift import monitor
    from pipelines.simulate.generator import Drift, GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    raw = tmp_path / "raw"
    write_raw_logs(GeneratorConfig(seed=1, records=3000, days=3, end_date=date(2026, 11, 10), bad_share=0.03), raw)
    write_raw_logs(GeneratorConfig(seed=2, records=800, end_date=date(2026, 11, 11), bad_share=0.03), raw)
    write_raw_logs(
        GeneratorConfig(
            seed=3, records=800, end_date=date(2026, 11, 12), bad_share=0.03, drift=Drift.HOLIDAY, drift_magnitude=0.8
        ),
        raw,
    )
    # stand-in for the champion's training window from the MLflow registry (the real read:
    # tests/test_drift_scenario.py::test_drift_alert_retrains_once_under_the_scheduler_on_postgres)
    monkeypatch.setattr(monitor, "reference_window", lambda settings: DateWindow.parse("2026-11-08", "2026-11-10"))
    return load_settings(root=str(tmp_path), drift={"min_records": 100, "embedding_sample": 150})


def test_monitor_flags_holiday_drift_but_not_a_normal_day(
    traffic_root, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipelines.drift.monitor import mark_emitted, run_monitor

    settings = traffic_root
    shell = tmp_path / "where-the-user-stands"
    shell.mkdir()
    monkeypatch.chdir(shell)
    now = datetime(2026, 11, 12, 12, tzinfo=UTC)
    normal = run_monitor(settings, date(2026, 11, 11), now=now)
    assert normal["verdict"] in ("stable", "watch") and not normal["fire"], normal["signals"]
    assert {s["signal"] for s in normal["signals"]} >= {
        "tool",
        "country",
        "request_length",
        "request_text",
        "invalid_tool_call_rate",
    }
    reference = Path(settings.zone("features")) / "drift_reference" / "2026-11-08_2026-11-10"
    assert (reference / "summary.json").is_file() and (reference / "embeddings.npy").is_file()

    drifted = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(minutes=5))
    assert drifted["verdict"] == "act" and drifted["fire"] and drifted["reason"].startswith("drift: ")
    acting = {s["signal"] for s in drifted["signals"] if s["band"] == "act"}
    assert acting & {"category", "request_text", "tool"}, drifted["signals"]
    assert Path(drifted["html_uri"]).is_file() and "<img" in Path(drifted["html_uri"]).read_text()
    # each check's report is an artifact of its MLflow run, kept where the local server serves them (the
    # SQLite store's default, ./mlruns, would land in whatever directory the check ran from)
    from pipelines.clients.mlflow import client as mlflow_client

    experiment = mlflow_client(settings).get_experiment_by_name("drift-monitor")
    assert experiment.artifact_location.startswith(Path(str(settings.mlflow.artifacts_destination)).as_uri())
    assert not (shell / "mlruns").exists()

    # a second alert inside the cooldown is recorded, not emitted: one retrain, not two
    mark_emitted(settings, drifted["checked_at"])
    again = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(hours=1))
    assert again["verdict"] == "act" and not again["fire"] and again["suppressed_by_cooldown"]
    later = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(hours=settings.drift.cooldown_hours + 1))
    assert later["fire"]


def test_only_an_emitted_alert_starts_the_cooldown(traffic_root) -> None:
    """check fires -> its alert task fails (never marked) -> the next check still fires; once marked
    emitted, the next check inside the cooldown is suppressed. Only emitted alerts count."""
    import json

    from pipelines import tasks
    from pipelines.drift.monitor import run_monitor

    settings = traffic_root
    now = datetime(2026, 11, 12, 12, tzinfo=UTC)
    first = run_monitor(settings, date(2026, 11, 12), now=now)
    assert first["fire"], first["signals"]
    state_file = Path(settings.zone("reports")) / "drift" / "state.json"
    state = json.loads(state_file.read_text())
    assert state["alerts"][-1]["emitted"] is False and "last_alert_at" not in state  # pending, no cooldown

    # the alert task failed: nothing was emitted, so the next check is not silenced
    second = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(minutes=30))
    assert second["fire"] and not second["suppressed_by_cooldown"]

    # the DAG's mark_emitted task after a successful alert: the cooldown starts at that check
    marked = tasks.drift_alert_emitted(settings, {"checked_at": second["checked_at"]})
    assert marked["emitted"] and marked["at"] == second["checked_at"]
    third = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(hours=1))
    assert not third["fire"] and third["suppressed_by_cooldown"]
    state = json.loads(state_file.read_text())
    assert [a["emitted"] for a in state["alerts"]] == [False, True, False], state["alerts"]
    assert state["last_alert_at"] == second["checked_at"]
    assert (Path(settings.zone("reports")) / "drift" / "state.json.lock").exists()  # written under the lock


def test_state_lock_times_out_with_a_clear_error(tmp_path: Path) -> None:
    from filelock import FileLock

    from pipelines.drift import monitor

    settings = load_settings(root=str(tmp_path), drift={"state_lock_timeout_s": 0.2})
    with FileLock(str(monitor._lock_path(settings))):  # another check holds it
        with pytest.raises(monitor.StateLockTimeout, match="state lock"):
            monitor.mark_emitted(settings, "2026-11-12T12:00:00+00:00")
    assert not (tmp_path / "reports" / "drift" / "state.json").exists()
    monitor.mark_emitted(settings, "2026-11-12T12:00:00+00:00")
    assert (tmp_path / "reports" / "drift" / "state.json").is_file()


def write_custom_toolset_window(tmp_path: Path, raw_zone: str, day: date, n: int = 20) -> None:
    """n turns under a made-up imported toolset, written and registered the way the retail importer does."""
    import json

    from pipelines.simulate.importers import retail_to_raw

    tools = [
        {
            "type": "function",
            "function": {
                "name": "wrap_gift",
                "description": "Gift-wrap an order's items.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "order_id": {"type": "string"},
                        "paper": {"type": "string", "enum": ["red", "gold"]},
                    },
                    "required": ["order_id", "paper"],
                    "additionalProperties": False,
                },
            },
        }
    ]
    tasks = [
        {
            "instruction": f"Please gift-wrap order #W{i} in {paper} paper.",
            "actions": [{"name": "wrap_gift", "arguments": {"order_id": f"#W{i}", "paper": paper}}],
        }
        for i, paper in enumerate(["red", "gold"] * (n // 2))
    ]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    (tmp_path / "tasks.jsonl").write_text("\n".join(json.dumps(t) for t in tasks) + "\n")
    retail_to_raw(tmp_path / "tools.json", tmp_path / "tasks.jsonl", Path(raw_zone), day)


def test_imported_toolset_turns_are_clean_for_the_monitor(tmp_path: Path) -> None:
    """Turns under a registered (imported) toolset validate against its schemas, as in prep: a retail
    window must not read as 100 % unknown tools."""
    from pipelines.drift.monitor import parse_window
    from pipelines.window import DateWindow

    settings = load_settings(root=str(tmp_path / "root"))
    day = date(2026, 11, 12)
    write_custom_toolset_window(tmp_path, settings.zone("raw"), day)
    clean, reasons, lines = parse_window(settings, DateWindow.ending(day, 1))
    assert lines == 20 and reasons == {} and len(clean) == 20, reasons
    assert set(clean["tool"]) == {"wrap_gift"}


def test_parallel_parse_gives_the_same_window(tmp_path: Path) -> None:
    """A window of several chunks is parsed by a process pool (with the registered toolsets): same rows,
    same order, same reasons as in-process."""
    from pipelines.drift.monitor import parse_window
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    root, day = tmp_path / "root", date(2026, 11, 12)
    write_raw_logs(GeneratorConfig(seed=5, records=900, end_date=day, bad_share=0.1), root / "raw")
    write_custom_toolset_window(tmp_path, str(root / "raw"), day, 40)
    window = DateWindow.ending(day, 1)
    fresh = {"parse_cache": False, "parse_chunk_lines": 100}  # both parse (no kept parse serves the second)
    serial = parse_window(load_settings(root=str(root), drift={**fresh, "parse_workers": 1}), window)
    pooled = parse_window(load_settings(root=str(root), drift={**fresh, "parse_workers": 2}), window)
    assert serial[2] == pooled[2] == 940 and serial[1] == pooled[1] and sum(serial[1].values()) > 20
    assert (pooled[0]["tool"] == "wrap_gift").sum() == 40  # the workers got the registered toolsets too
    assert serial[0].equals(pooled[0])


def test_empty_windows_give_one_clear_error_not_a_key_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    from pipelines.drift import monitor
    from pipelines.drift.signals import EmptyWindow, summarize
    from pipelines.errors import NotRetryable
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    cfg = load_settings().drift
    for empty in (pd.DataFrame(), pd.DataFrame(columns=["request_text", "tool"])):
        with pytest.raises(EmptyWindow, match="no clean records in the reference window"):
            summarize(empty, {}, cfg)
    assert issubclass(EmptyWindow, NotRetryable)

    # a reference window with no raw logs at all (and one with only bad lines): NoReference, one line
    raw = tmp_path / "raw"
    write_raw_logs(GeneratorConfig(seed=1, records=300, end_date=date(2026, 11, 12), bad_share=0.03), raw)
    (raw / "dt=2026-11-05").mkdir(parents=True)
    (raw / "dt=2026-11-05" / "broken.jsonl").write_text('{"record_id": "r1"\nnot json\n\n')
    settings = load_settings(root=str(tmp_path), drift={"min_records": 100})
    frame, _, lines = monitor.parse_window(settings, DateWindow.parse("2026-11-01", "2026-11-02"))
    assert frame.empty and lines == 0 and "request_text" in frame.columns
    for start, end in (("2026-11-01", "2026-11-02"), ("2026-11-05", "2026-11-05")):
        # stand-in for the champion's training window from the MLflow registry (the real read:
        # tests/test_drift_scenario.py::test_drift_alert_retrains_once_under_the_scheduler_on_postgres)
        monkeypatch.setattr(monitor, "reference_window", lambda settings, s=start, e=end: DateWindow.parse(s, e))
        with pytest.raises(monitor.NoReference, match="has no clean records"):
            monitor.run_monitor(settings, date(2026, 11, 12))


def test_monitor_reads_and_writes_object_storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object-store root (fsspec's in-memory filesystem standing in for s3://): gzipped raw logs are
    read, the reference, the reports and the state are written there; the lock is a local file."""
    import fsspec

    from pipelines.drift import monitor
    from pipelines.simulate.generator import Drift, GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    local = tmp_path / "gen"
    write_raw_logs(
        GeneratorConfig(seed=1, records=1500, days=2, end_date=date(2026, 11, 10), bad_share=0.03), local, compress=True
    )
    write_raw_logs(
        GeneratorConfig(
            seed=3, records=600, end_date=date(2026, 11, 12), bad_share=0.03, drift=Drift.HOLIDAY, drift_magnitude=0.8
        ),
        local,
        compress=True,
    )
    fs = fsspec.filesystem("memory")
    bucket = f"/drift-test-{tmp_path.name}"
    for file in local.rglob("*.jsonl.gz"):
        fs.pipe(f"{bucket}/raw/{file.relative_to(local).as_posix()}", file.read_bytes())
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    settings = load_settings(root=str(tmp_path / "local"), drift={"min_records": 100, "embedding_sample": 150})
    object.__setattr__(settings, "root", f"memory://{bucket}")  # MLflow stays on the local SQLite store
    # stand-in for the champion's training window from the MLflow registry (the real read:
    # tests/test_drift_scenario.py::test_drift_alert_retrains_once_under_the_scheduler_on_postgres)
    monkeypatch.setattr(monitor, "reference_window", lambda settings: DateWindow.parse("2026-11-09", "2026-11-10"))
    try:
        result = monitor.run_monitor(settings, date(2026, 11, 12), now=datetime(2026, 11, 12, 12, tzinfo=UTC))
        assert result["lines"] == 600 and result["fire"], result.get("reason")
        monitor.mark_emitted(settings, result["checked_at"])
        ref = f"{bucket}/features/drift_reference/2026-11-09_2026-11-10"
        assert fs.exists(f"{ref}/summary.json") and fs.exists(f"{ref}/embeddings.npy")
        assert fs.exists(result["html_uri"].removeprefix("memory://"))
        assert fs.cat(f"{bucket}/reports/drift/state.json").count(b'"emitted": true') == 1
        assert list((tmp_path / "home" / ".flywheel" / "locks").glob("*.lock"))
        assert not (tmp_path / "local" / "features").exists() and not (tmp_path / "local" / "reports").exists()
        summary, vectors = monitor.reference(settings, DateWindow.parse("2026-11-09", "2026-11-10"))  # stored copy
        assert vectors.shape == (150, 384) and summary.records > 1000
    finally:
        fs.rm(bucket, recursive=True)


def test_a_numeric_signal_with_few_values_is_not_judged() -> None:
    """Amounts appear in a few % of requests: 40 values in ten bins would read as drift; they are skipped."""
    import pandas as pd

    from pipelines.drift.signals import compare, summarize

    cfg = load_settings().drift
    rng = np.random.default_rng(3)

    def frame(n: int, with_amount: int) -> pd.DataFrame:
        amounts = np.full(n, np.nan)
        amounts[:with_amount] = rng.lognormal(4, 1, with_amount)
        return pd.DataFrame(
            {
                "tool": "get_order",
                "workload_id": "orders",
                "country": "US",
                "currency": "USD",
                "channel": "web",
                "category": None,
                "request_text": "where is my order",
                "latency_ms": rng.lognormal(7, 0.3, n),
                "amount": amounts,
                "feedback": "none",
            }
        )

    ref = summarize(frame(2000, 800), {}, cfg)
    few = compare(ref, summarize(frame(600, 40), {}, cfg, edges=ref.numeric_edges), cfg)
    enough = compare(ref, summarize(frame(600, 300), {}, cfg, edges=ref.numeric_edges), cfg)
    assert "amount" not in {r.signal for r in few} and "latency_ms" in {r.signal for r in few}
    assert {r.signal: r.band for r in enough}["amount"] == "stable"


def test_drift_sweep_id_includes_the_reference_days(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A drift retrain mixes the reference days into its rows: it must not reuse an unmixed sweep's variants."""
    from pipelines.prep import dataset
    from pipelines.train.sweep import sweep_id_for
    from pipelines.train.sweep_config import load_sweep

    # stand-in for the data path's manifest (the real one, read for a sweep's id:
    # tests/test_sweep_registry.py::test_sweep_logs_parent_and_child_runs_and_a_retry_reuses_them)
    monkeypatch.setattr(
        dataset, "manifest", lambda settings, window=None: {"training_set": {"digest": "0123456789abcdef"}}
    )
    settings = load_settings(root=str(tmp_path))
    sweep = load_sweep(str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "drift.yaml"))
    plain = sweep_id_for(settings, sweep)
    days = ["2026-11-08", "2026-11-09", "2026-11-10"]
    mixed = sweep_id_for(settings, sweep, days)
    assert plain == sweep_id_for(settings, sweep, None) == sweep_id_for(settings, sweep, [])
    assert mixed != plain and mixed.startswith(plain)
    assert sweep_id_for(settings, sweep, list(reversed(days))) == mixed  # same days, same sweep
    assert sweep_id_for(settings, sweep, days[1:]) != mixed
    other_share = load_settings(root=str(tmp_path), drift={"retrain_reference_share": 0.5})
    assert sweep_id_for(other_share, sweep, days) != mixed


def test_a_check_parses_only_the_files_that_arrived_or_changed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each raw file's parse is kept by its content hash: the next check gives the same rows, reasons and lines as
    a full parse while parsing only the new file; a changed file is parsed again; a removed one's parse goes.
    (Mutations tried: a key without the content hash keeps serving a changed file's old rows; no prune keeps a
    removed file's parse.)"""
    from pipelines.drift import monitor
    from pipelines.drift.parsed import folder
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    root, day = tmp_path / "root", date(2026, 11, 12)
    write_raw_logs(GeneratorConfig(seed=5, records=600, end_date=day, bad_share=0.1), root / "raw")
    settings = load_settings(root=str(root), drift={"parse_workers": 1, "parse_chunk_lines": 100})
    window = DateWindow.ending(day, 1)
    parsed: list[str] = []
    real = monitor._parse_lines

    def counting(lines, source, tools):
        parsed.append(source)
        return real(lines, source, tools)

    monkeypatch.setattr(monitor, "_parse_lines", counting)
    first = monitor.parse_window(settings, window)
    assert parsed, "the first check parses everything"
    parsed.clear()
    again = monitor.parse_window(settings, window)
    assert parsed == [] and again[0].equals(first[0]) and again[1:] == first[1:]

    hour = root / "raw" / f"dt={day}" / "gateway-late-hour.jsonl"  # a new file arrives
    hour.write_bytes(b"\n".join((root / "raw" / f"dt={day}").glob("*.jsonl").__next__().read_bytes().splitlines()[:50]))
    later = monitor.parse_window(settings, window)
    assert set(parsed) == {str(hour)} and later[2] == first[2] + 50
    uncached = monitor.parse_window(
        load_settings(root=str(root), drift={"parse_cache": False, "parse_workers": 1}), window
    )
    assert later[0].equals(uncached[0]) and later[1:] == uncached[1:]

    parsed.clear()
    hour.write_bytes(hour.read_bytes().splitlines()[0] + b"\n")  # the file changes: one line left
    changed = monitor.parse_window(settings, window)
    assert set(parsed) == {str(hour)} and changed[2] == first[2] + 1
    kept = lambda: sorted(Path(folder(settings)).glob("*.parquet"))  # noqa: E731
    before = len(kept())
    hour.unlink()  # removed: its parse goes with it
    gone = monitor.parse_window(settings, window)
    assert gone[2] == first[2] and len(kept()) == before - 1


def test_a_canarys_teacher_copies_are_not_counted_as_traffic(tmp_path: Path) -> None:
    """A canary's teacher copy (`<id>-teacher`) is a second answer to a request already counted: the monitor leaves
    it out (mutation tried: the suffix check removed, and the copies are counted twice)."""
    from pipelines.drift.monitor import _parse_lines
    from pipelines.logs.schema import TEACHER_COPY_SUFFIX
    from pipelines.logs.tools import TOOLS_BY_NAME
    from pipelines.simulate.generator import GeneratorConfig, write_raw_logs

    write_raw_logs(GeneratorConfig(seed=3, records=50, end_date=date(2026, 11, 12), bad_share=0.0), tmp_path)
    lines = [line for f in sorted(tmp_path.rglob("*.jsonl")) for line in f.read_text().splitlines() if line.strip()]
    copies = []
    for line in lines[:10]:
        record = json.loads(line)
        copies.append(json.dumps({**record, "record_id": record["record_id"] + TEACHER_COPY_SUFFIX}))
    broken = json.loads(copies[0])  # a teacher's call prep would quarantine: not the served model's health either
    broken["response"]["choices"][0]["message"] = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "no_such_tool", "arguments": "{}"}}]}  # fmt: skip
    rows, reasons, _ = _parse_lines(lines, "raw.jsonl", dict(TOOLS_BY_NAME))
    with_copies, with_reasons, _ = _parse_lines([*lines, *copies, json.dumps(broken)], "raw.jsonl", dict(TOOLS_BY_NAME))
    assert rows and len(with_copies) == len(rows) and with_reasons == reasons
    alone, quarantined, _ = _parse_lines([json.dumps({**broken, "record_id": "x"})], "raw.jsonl", dict(TOOLS_BY_NAME))
    assert not alone and sum(quarantined.values()) == 1  # the same line as a served turn is quarantined, counted
