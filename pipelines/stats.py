"""Paired comparisons: two conditions answered the same requests, so compare them request by request.

Every quality claim of the platform (the evaluation report, the promotion gate, `flywheel eval`, the
real-data benchmark) is a difference between two conditions on the same requests with its paired 95 %
interval: a bootstrap over requests (each resample draws whole requests, so both sides move together), and
for a yes/no metric (exact match, name) McNemar's exact test on the requests where the two disagree. On 24
requests a 0.02 gain or loss means nothing; the interval says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

METRICS = ("task", "exact_match", "name_accuracy", "arg_f1", "text_f1")
BINARY = ("exact_match", "name_accuracy")
DEFAULT_TOOL_METRIC = "exact_match"


def interval(
    a: Sequence[float | None], b: Sequence[float | None], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> dict[str, Any]:
    """Mean of a - b over the requests both sides scored, with the paired percentile bootstrap interval.
    `a` and `b` are aligned: position i is the same request on both sides.

    The interval is resampled with one request won and one lost added (differences of +1 and -1, as
    Agresti and Caffo add pseudo-counts to a paired proportion): a bootstrap of n identical answers is
    otherwise [0, 0] however small n is, and would call 4 requests "quality held". With the pseudo-pair,
    24 identical answers give about [-0.10, +0.10] and 96 about [-0.03, +0.03]. `diff` is the plain mean."""
    if len(a) != len(b):
        raise ValueError(f"paired scores differ in length: {len(a)} vs {len(b)}")
    diffs = np.array([float(x) - float(y) for x, y in zip(a, b) if x is not None and y is not None])
    n = int(diffs.size)
    if n == 0:
        return {"n": 0, "diff": None, "low": None, "high": None, "level": level}
    rng = np.random.default_rng(seed)
    padded = np.concatenate([diffs, [1.0, -1.0]])
    means = padded[rng.integers(0, padded.size, size=(resamples, padded.size))].mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return {
        "n": n,
        "diff": round(float(diffs.mean()), 6),
        "low": round(float(low), 6),
        "high": round(float(high), 6),
        "level": level,
    }


def mcnemar(a: Sequence[float | None], b: Sequence[float | None]) -> dict[str, Any]:
    """McNemar's exact test for a yes/no metric: `wins` (a right, b wrong), `losses` (the reverse) and the
    two-sided binomial p-value of that split under "no difference"."""
    wins = sum(1 for x, y in zip(a, b) if x is not None and y is not None and x > y)
    losses = sum(1 for x, y in zip(a, b) if x is not None and y is not None and x < y)
    k, n = min(wins, losses), wins + losses
    p = 1.0 if n == 0 else min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)
    return {"wins": wins, "losses": losses, "p": round(p, 6)}


def task_values(requests: Sequence[Mapping[str, Any]], judged_on: Mapping[str, str]) -> list[float | None]:
    """Each request's task score: its expected tool's judged metric (`promotion.tool_metrics`, exact match
    for a tool not named), falling back to exact match where that metric does not apply to the request."""
    out: list[float | None] = []
    for r in requests:
        value = r.get(judged_on.get(str(r.get("tool")), DEFAULT_TOOL_METRIC))
        out.append(float(value) if value is not None else float(r.get("exact_match") or 0.0))
    return out


def align(
    candidate: Sequence[Mapping[str, Any]], reference: Sequence[Mapping[str, Any]]
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """The requests both sides answered, in the same order (by record id)."""
    theirs = {r["record_id"]: r for r in reference}
    pairs = [(r, theirs[r["record_id"]]) for r in candidate if r.get("record_id") in theirs]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def compare(
    candidate: Sequence[Mapping[str, Any]],
    reference: Sequence[Mapping[str, Any]],
    judged_on: Mapping[str, str] | None = None,
    *,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    min_tool_examples: int = 5,
) -> dict[str, Any]:
    """Every paired difference of `candidate` against `reference` (per-request scores, see
    `ConditionResult.per_request`): overall per metric, with McNemar for yes/no metrics, the wrong writes
    on both sides, and per tool (tools with at least `min_tool_examples` requests)."""
    judged_on = judged_on or {}
    ours, theirs = align(candidate, reference)

    def values(rows: Sequence[Mapping[str, Any]], metric: str) -> list[float | None]:
        if metric == "task":
            return task_values(rows, judged_on)
        key = "name_match" if metric == "name_accuracy" else metric
        return [None if r.get(key) is None else float(r[key]) for r in rows]

    out: dict[str, Any] = {"n": len(ours), "metrics": {}, "per_tool": {}}
    for metric in METRICS:
        a, b = values(ours, metric), values(theirs, metric)
        entry = interval(a, b, resamples=resamples, seed=seed, level=level)
        if metric in BINARY:
            entry["mcnemar"] = mcnemar(a, b)
        out["metrics"][metric] = entry
    out["wrong_writes"] = [
        sum(int(bool(r.get("wrong_write"))) for r in ours),
        sum(int(bool(r.get("wrong_write"))) for r in theirs),
    ]
    for tool in sorted({str(r.get("tool")) for r in ours}):
        idx = [i for i, r in enumerate(ours) if str(r.get("tool")) == tool]
        if len(idx) < min_tool_examples:
            continue
        mine, other = [ours[i] for i in idx], [theirs[i] for i in idx]
        out["per_tool"][tool] = {
            "n": len(idx),
            "metric": judged_on.get(tool, DEFAULT_TOOL_METRIC),
            **interval(
                task_values(mine, judged_on),
                task_values(other, judged_on),
                resamples=resamples,
                seed=seed,
                level=level,
            ),
        }
    return out


def describe(entry: Mapping[str, Any], label: str) -> str:
    """`task score +0.03, 95% CI [-0.02, +0.08], n=96` (or `n/a` without paired requests)."""
    if not entry.get("n"):
        return f"{label} n/a (no paired requests)"
    return (
        f"{label} {entry['diff']:+.3f}, {entry['level']:.0%} CI [{entry['low']:+.3f}, {entry['high']:+.3f}], "
        f"n={entry['n']}"
    )


def always_valid(successes: float, n: int, level: float = 0.95, binary: bool = True) -> tuple[float, float]:
    """An interval for a rate in [0, 1] that holds at every n at once (a confidence sequence), so a live test
    may look after every request and stop as soon as it decides: the level's error is spent over n as
    alpha_n = alpha * 6 / (pi^2 n^2) (they sum to alpha), and each n gets the exact Clopper-Pearson interval
    at 1 - alpha_n for a yes/no rate (`binary`), or Hoeffding's for a mean of values in [0, 1] (arg F1)."""
    if n <= 0:
        return 0.0, 1.0
    alpha_n = (1 - level) * 6 / (math.pi**2 * n**2)
    if not binary:
        radius = math.sqrt(math.log(2 / alpha_n) / (2 * n))
        mean = successes / n
        return max(0.0, mean - radius), min(1.0, mean + radius)
    from scipy.stats import beta

    k = int(round(successes))
    low = 0.0 if k == 0 else float(beta.ppf(alpha_n / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha_n / 2, k + 1, n - k))
    return low, high
