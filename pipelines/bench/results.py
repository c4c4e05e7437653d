"""What the serving benchmark makes of its timed replies (pure: no server): nearest-rank percentiles, one
model's run at one concurrency as a row, the table the CLI and the demo print, and the tuned model against the
base with a paired bootstrap interval of the median latency's change.
"""

from __future__ import annotations

import math
from typing import Any

from pipelines.bench.report import LATENCY_KEYS, QUALITY_KEYS
from pipelines.serve.client import Reply
from pipelines.serve.deploy import score_replies

CONSTRAINED_LABEL = ", constrained"  # a row decoded under the offered tools' grammar


def min_samples(q: float) -> int:
    """The smallest sample that supports a q-th percentile: some values must lie above it (p95: 20,
    p99: 100); a median needs one."""
    return 1 if q <= 50 else math.ceil(100 / (100 - q) - 1e-9)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100): the value at or above q% of the sample; None where the
    sample is too small to support it (`min_samples`), so 8 requests report no p95 rather than their max."""
    if len(values) < min_samples(q) or not values:
        return None
    ordered = sorted(values)
    return round(ordered[nearest_rank(len(ordered), q) - 1], 1)


def nearest_rank(n: int, q: float) -> int:
    """The 1-based rank of the nearest-rank q-th percentile of n values: ceil(n q / 100), at least 1."""
    return int(max(1, -(-n * q // 100)))


def summarize_run(
    label: str,
    concurrency: int,
    rows: list[dict[str, Any]],
    replies: list[Reply],
    seconds: float,
    timeout_ms: float | None = None,
) -> dict[str, Any]:
    """One model at one concurrency. Every request counts: an errored one is a wrong answer in exact
    match and a latency sample at the client's timeout (`timeout_ms`; at least the time it took), so a
    server that fails fast does not look fast; requests/s counts answered requests only (goodput);
    `requests` and `errors` say how many were sent and failed."""
    ok = [r for r in replies if r.error is None]
    latencies = [r.latency_ms if r.error is None else max(r.latency_ms, timeout_ms or 0.0) for r in replies]
    quality = score_replies(rows, replies)
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "model": label,
        "concurrency": concurrency,
        "requests": len(replies),
        "errors": len(replies) - len(ok),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "requests_per_s": round(len(ok) / seconds, 3) if seconds else 0.0,
        "output_tokens_per_s": round(out_tokens / seconds, 1) if seconds else 0.0,
        "prompt_tokens_mean": quality["prompt_tokens_mean"],
        "exact_match": quality["exact_match"],
        "name_accuracy": quality["name_accuracy"],
        "ttft_ms": percentile([r.first_token_ms for r in ok if r.first_token_ms is not None], 50),
        "itl_ms": percentile([r.inter_token_ms for r in ok if r.inter_token_ms is not None], 50),
        "wrong_writes": quality["wrong_writes"],
        "first_error": next((r.error for r in replies if r.error), None),
        "latencies_ms": [round(x, 1) for x in latencies],  # every request, in the rows' order (errors too)
        "errored": [i for i, r in enumerate(replies) if r.error is not None],
        "exact": quality["exact"],  # every request's exact match (1/0), in the rows' order
    }


TABLE_COLUMNS = (
    "model",
    "decoding",
    "in flight",
    "requests",
    "errors",
    "TTFT ms",
    "ITL ms",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "req/s",
    "prompt tokens",
    "exact",
    "$/M req",
)
_TABLE_KEYS = (*LATENCY_KEYS, *QUALITY_KEYS)  # the cells after model and decoding, in TABLE_COLUMNS


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """The report's runs (and the in-process run) as text cells under TABLE_COLUMNS: what the CLI and
    the demo print; a figure the sample does not support reads "n/a"."""

    def cell(value: Any) -> str:
        if value is None:
            return "n/a"
        return f"{value:.3f}" if isinstance(value, float) and abs(value) < 10 else str(value)

    runs = [*report["runs"], *([report["direct"]] if report.get("direct") else [])]
    rows = []
    for r in runs:
        constrained = r.get("constrained", r["model"].endswith(CONSTRAINED_LABEL))
        name = r["model"].removesuffix(CONSTRAINED_LABEL)
        rows.append([name, "grammar" if constrained else "free", *(cell(r.get(k)) for k in _TABLE_KEYS)])
    return rows


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
MIN_PAIRS = 8  # below it the bootstrapped median takes too few values for a 95 % interval to hold its coverage


def paired_p50_change_ci(
    base: list[float],
    tuned: list[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    min_pairs: int = MIN_PAIRS,
) -> list[float] | None:
    """95 % interval of the median latency's relative change, tuned against base: a percentile bootstrap over
    the requests, paired (both models answered the same requests: request i's two latencies are resampled
    together). It covers which requests were drawn, given each model's one timed pass (not what moved between
    the passes). None with fewer than `min_pairs` pairs, lists of different lengths, or a resample whose base
    median is not above 0."""
    import numpy as np

    if len(base) != len(tuned) or len(base) < max(2, min_pairs):
        return None
    a, b = np.asarray(base, dtype=float), np.asarray(tuned, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    rank = nearest_rank(len(a), 50) - 1  # the median as `percentile` takes it
    low, high = np.sort(a[picks], axis=1)[:, rank], np.sort(b[picks], axis=1)[:, rank]
    if not (low > 0).all():
        return None
    lo, hi = np.percentile((high - low) / low, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)] if np.isfinite([lo, hi]).all() else None


def _compare(base: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    def change(a: float | None, b: float | None) -> float | None:
        return round((b - a) / a, 3) if a and b is not None else None

    a, b = base.get("latencies_ms") or [], tuned.get("latencies_ms") or []
    pairs, level = min(len(a), len(b)), tuned["concurrency"]
    ci = paired_p50_change_ci(a, b) if level == 1 else None
    if ci is not None:
        interval = (
            f"percentile bootstrap over the {pairs} requests, paired ({BOOTSTRAP_RESAMPLES} resamples, seed "
            f"{BOOTSTRAP_SEED}), one request at a time; it covers which requests were drawn, given each "
            "model's one timed pass"
        )
    else:
        interval = "none: " + (
            f"at concurrency {level} requests in flight together slow each other, so they are "
            "not resampled as independent"
            if level != 1
            else f"{pairs} requests, fewer than the {MIN_PAIRS} an interval of the median needs"
            if pairs < MIN_PAIRS
            else "the two models' request lists differ, or a resample's base median is 0"
        )
    return {
        "latency_p50_change": change(base["p50_ms"], tuned["p50_ms"]),
        "latency_p50_change_ci95": ci,
        "paired_requests": pairs,
        "concurrency": level,
        "interval": interval,
        "prompt_tokens_change": change(base["prompt_tokens_mean"], tuned["prompt_tokens_mean"]),
        "throughput_change": change(base["requests_per_s"], tuned["requests_per_s"]),
        "cost_change": change(base.get("usd_per_million_requests"), tuned.get("usd_per_million_requests")),
        "exact_match": {"base_few_shot": base["exact_match"], "tuned": tuned["exact_match"]},
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


PRECISION_REFERENCE = "fp32"
PRECISION_MARGIN = 0.05  # exact match: a precision holds quality when its paired interval's low end is above -margin


def precision_comparison(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each precision's runs ({precision: its runs, one per concurrency}, the same requests) against fp32's at the
    same concurrency: output tokens/s and requests/s ratios, TTFT and ITL ratios, exact match paired per request
    (`stats.interval`, 95 %) with the non-inferiority verdict at PRECISION_MARGIN, and both sides' wrong writes.
    Empty without an fp32 run to compare with."""
    from pipelines.stats import interval

    reference = {r["concurrency"]: r for r in runs.get(PRECISION_REFERENCE, [])}
    if not reference:
        return {}

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    rows = []
    for precision, measured in runs.items():
        if precision == PRECISION_REFERENCE:
            continue
        for run in measured:
            ref = reference.get(run["concurrency"])
            if ref is None:
                continue
            paired = interval(run["exact"], ref["exact"])
            rows.append(
                {
                    "precision": precision,
                    "concurrency": run["concurrency"],
                    "output_tokens_per_s_ratio": ratio(run["output_tokens_per_s"], ref["output_tokens_per_s"]),
                    "requests_per_s_ratio": ratio(run["requests_per_s"], ref["requests_per_s"]),
                    "ttft_ratio": ratio(run["ttft_ms"], ref["ttft_ms"]),
                    "itl_ratio": ratio(run["itl_ms"], ref["itl_ms"]),
                    "exact_match_diff": paired,
                    "quality_held": paired["low"] is not None and paired["low"] > -PRECISION_MARGIN,
                    "wrong_writes": {precision: run["wrong_writes"], PRECISION_REFERENCE: ref["wrong_writes"]},
                    "errors": {precision: run["errors"], PRECISION_REFERENCE: ref["errors"]},
                }
            )
    return {"reference": PRECISION_REFERENCE, "margin": PRECISION_MARGIN, "rows": rows}
