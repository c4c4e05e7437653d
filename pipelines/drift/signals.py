"""What the monitor compares: summaries of a window of agent logs, and drift between two summaries.

A summary holds category counts, decile-binned numeric counts (edges from the reference), a sample
of request texts' MiniLM embeddings, and health rates. Summaries are small JSON (+ one .npy), so the
monitor keeps the reference's and never rescans the champion's training data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from pipelines.config import DriftSettings
from pipelines.drift import metrics
from pipelines.errors import NotRetryable

CATEGORICAL = ("tool", "workload_id", "country", "currency", "channel", "category")
NUMERIC = ("request_length", "latency_ms", "amount")
INVALID_CALL_REASONS = ("unknown_tool", "invalid_arguments")


class EmptyWindow(NotRetryable, ValueError):
    """A window with no clean records has no distribution to summarize."""


@dataclass
class Summary:
    records: int
    categorical: dict[str, dict[str, int]]
    numeric_edges: dict[str, list[float]]
    numeric_counts: dict[str, list[float]]
    numeric_sample: dict[str, list[float]]  # for Wasserstein and the before/after histograms
    health: dict[str, float]
    texts: list[str] = field(default_factory=list)  # the embedding sample's request texts

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__.items())


def signal_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """Clean rows (our clean-log columns) with the derived numeric signals."""
    frame = rows.copy()
    frame["request_length"] = frame["request_text"].fillna("").str.len().astype(float)
    for column in CATEGORICAL:
        frame[column] = frame[column].fillna("(none)").astype(str)
    return frame


def summarize(
    clean: pd.DataFrame,
    quarantine_reasons: dict[str, int],
    cfg: DriftSettings,
    edges: dict[str, list[float]] | None = None,
    seed: int = 0,
) -> Summary:
    """Summary of one window. `edges`: the reference's bin edges (None: this is the reference)."""
    if len(clean) == 0:  # also a frame without columns (no rows were parsed): never a KeyError
        side = "reference" if edges is None else "current"
        raise EmptyWindow(f"no clean records in the {side} window: nothing to summarize")
    frame = signal_frame(clean)
    n = len(frame)
    categorical = {c: {str(k): int(v) for k, v in frame[c].value_counts().items()} for c in CATEGORICAL}
    edges = edges or {c: metrics.quantile_edges(frame[c].to_numpy(float), cfg.numeric_bins).tolist() for c in NUMERIC}
    counts = {c: metrics.binned_counts(frame[c].to_numpy(float), np.array(edges[c])).tolist() for c in NUMERIC}
    sample = frame.sample(n=min(n, cfg.numeric_sample), random_state=seed)
    numeric_sample = {c: [float(v) for v in sample[c].dropna()] for c in NUMERIC}
    texts = frame["request_text"].fillna("").sample(n=min(n, cfg.embedding_sample), random_state=seed).tolist()
    invalid = sum(quarantine_reasons.get(r, 0) for r in INVALID_CALL_REASONS)
    health = {
        "invalid_tool_call_rate": invalid / (n + invalid),
        "thumbs_down_rate": float((frame["feedback"] == "down").mean()),
        "latency_slo_violation_rate": float((frame["latency_ms"] > cfg.latency_slo_ms).mean()),
    }
    return Summary(n, categorical, edges, counts, numeric_sample, health, texts)


@dataclass
class SignalResult:
    signal: str
    kind: str  # categorical | numeric | embedding | health
    metric: str
    value: float
    band: metrics.Band
    detail: dict[str, float] = field(default_factory=dict)


def compare(
    reference: Summary, current: Summary, cfg: DriftSettings, embeddings: tuple[np.ndarray, np.ndarray] | None = None
) -> list[SignalResult]:
    """Every signal's drift value and band (stable / watch / act) under the configured thresholds."""
    out = []
    for c in CATEGORICAL:
        r, k = metrics.aligned(reference.categorical[c], current.categorical[c])
        value = metrics.psi(r, k)
        out.append(
            SignalResult(
                c,
                "categorical",
                "psi",
                round(value, 4),
                metrics.band(value, cfg.psi_watch, cfg.psi_act),
                {"js_distance": round(metrics.js_distance(r, k), 4)},
            )
        )
    for c in NUMERIC:
        r, k = np.array(reference.numeric_counts[c]), np.array(current.numeric_counts[c])
        if min(r.sum(), k.sum()) < cfg.min_signal_count:
            continue  # too few values (e.g. amounts: a few % of requests) for ten bins: noise, not drift
        value = metrics.psi(r, k)
        detail = {}
        if reference.numeric_sample[c] and current.numeric_sample[c]:
            detail["wasserstein"] = round(
                metrics.wasserstein(reference.numeric_sample[c], current.numeric_sample[c]), 3
            )
        out.append(
            SignalResult(c, "numeric", "psi", round(value, 4), metrics.band(value, cfg.psi_watch, cfg.psi_act), detail)
        )
    if embeddings is not None:
        ref, cur = embeddings
        auc = metrics.classifier_auc(ref, cur)
        out.append(
            SignalResult(
                "request_text",
                "embedding",
                "domain_classifier_auc",
                round(auc, 4),
                metrics.band(auc, cfg.auc_watch, cfg.auc_act),
                {"mmd_rbf": round(metrics.mmd_rbf(ref, cur), 5)},
            )
        )
    for name, limit in (
        ("invalid_tool_call_rate", cfg.invalid_call_rate_act),
        ("thumbs_down_rate", cfg.thumbs_down_rate_act),
        ("latency_slo_violation_rate", cfg.latency_slo_violation_act),
    ):
        value = current.health[name]
        out.append(
            SignalResult(
                name,
                "health",
                "rate",
                round(value, 4),
                metrics.band(value, limit / 2, limit),
                {"reference": round(reference.health[name], 4)},
            )
        )
    return out
