"""Drift metrics against hand-computed answers, and the monitor on generated traffic (no drift vs
holiday drift), with its report, cooldown and the stored reference summary."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta, timezone
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


def test_a_million_records_summarize_in_seconds() -> None:
    import time

    rng = np.random.default_rng(2)
    ref, cur = rng.integers(0, 15, 1_000_000), rng.integers(0, 15, 1_000_000)
    started = time.perf_counter()
    psi = metrics.psi(np.bincount(ref, minlength=15), np.bincount(cur, minlength=15))
    values = rng.lognormal(size=1_000_000)
    edges = metrics.quantile_edges(values)
    metrics.psi(metrics.binned_counts(values, edges), metrics.binned_counts(values * 1.2, edges))
    assert psi < 0.001 and time.perf_counter() - started < 30  # generous: a busy CI machine


@pytest.fixture
def traffic_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Reference week, then a normal day and a holiday-drift day, as raw logs; the champion's
    training window is the reference week."""
    from pipelines.drift import monitor
    from pipelines.logs.generator import Drift, GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    raw = tmp_path / "raw"
    write_raw_logs(GeneratorConfig(seed=1, records=3000, days=3, end_date=date(2026, 11, 10), bad_share=0.03), raw)
    write_raw_logs(GeneratorConfig(seed=2, records=800, end_date=date(2026, 11, 11), bad_share=0.03), raw)
    write_raw_logs(GeneratorConfig(seed=3, records=800, end_date=date(2026, 11, 12), bad_share=0.03,
                                   drift=Drift.HOLIDAY, drift_magnitude=0.8), raw)
    monkeypatch.setattr(monitor, "reference_window", lambda settings: DateWindow.parse("2026-11-08", "2026-11-10"))
    return load_settings(root=str(tmp_path), drift={"min_records": 100, "embedding_sample": 150})


def test_monitor_flags_holiday_drift_but_not_a_normal_day(traffic_root) -> None:
    from pipelines.drift.monitor import run_monitor

    settings = traffic_root
    now = datetime(2026, 11, 12, 12, tzinfo=timezone.utc)
    normal = run_monitor(settings, date(2026, 11, 11), now=now)
    assert normal["verdict"] in ("stable", "watch") and not normal["fire"], normal["signals"]
    assert {s["signal"] for s in normal["signals"]} >= {"tool", "country", "request_length", "request_text",
                                                         "invalid_tool_call_rate"}
    reference = Path(settings.zone("features")) / "drift_reference" / "2026-11-08_2026-11-10"
    assert (reference / "summary.json").is_file() and (reference / "embeddings.npy").is_file()

    drifted = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(minutes=5))
    assert drifted["verdict"] == "act" and drifted["fire"] and drifted["reason"].startswith("drift: ")
    acting = {s["signal"] for s in drifted["signals"] if s["band"] == "act"}
    assert acting & {"category", "request_text", "tool"}, drifted["signals"]
    assert Path(drifted["html_uri"]).is_file() and "<img" in Path(drifted["html_uri"]).read_text()

    # a second alert inside the cooldown is recorded, not emitted: one retrain, not two
    again = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(hours=1))
    assert again["verdict"] == "act" and not again["fire"] and again["suppressed_by_cooldown"]
    later = run_monitor(settings, date(2026, 11, 12), now=now + timedelta(hours=settings.drift.cooldown_hours + 1))
    assert later["fire"]


def test_a_numeric_signal_with_few_values_is_not_judged() -> None:
    """Amounts appear in a few % of requests: 40 values in ten bins would read as drift; they are skipped."""
    import pandas as pd

    from pipelines.drift.signals import compare, summarize

    cfg = load_settings().drift
    rng = np.random.default_rng(3)

    def frame(n: int, with_amount: int) -> pd.DataFrame:
        amounts = np.full(n, np.nan)
        amounts[:with_amount] = rng.lognormal(4, 1, with_amount)
        return pd.DataFrame({"tool": "get_order", "workload_id": "orders", "country": "US", "currency": "USD",
                             "channel": "web", "category": None, "request_text": "where is my order",
                             "latency_ms": rng.lognormal(7, 0.3, n), "amount": amounts, "feedback": "none"})

    ref = summarize(frame(2000, 800), {}, cfg)
    few = compare(ref, summarize(frame(600, 40), {}, cfg, edges=ref.numeric_edges), cfg)
    enough = compare(ref, summarize(frame(600, 300), {}, cfg, edges=ref.numeric_edges), cfg)
    assert "amount" not in {r.signal for r in few} and "latency_ms" in {r.signal for r in few}
    assert {r.signal: r.band for r in enough}["amount"] == "stable"
