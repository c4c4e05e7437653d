"""Drift monitor throughput: summarize 1M log records and compare them with a reference (vectorized).

Usage: .venv/bin/python bench/drift.py [--records 1000000]
The embedding signal is sampled (drift.embedding_sample texts per side), so it does not grow with the
window; its time is printed separately.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from pipelines.config import load_settings
from pipelines.drift.signals import compare, summarize


def frame(n: int, seed: int, shift: float = 0.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    tools = np.array(["search_products", "get_order", "track_shipment", "create_invoice", "get_subscription"])
    p = np.array([0.4, 0.2, 0.2, 0.1, 0.1]) * (1 - shift) + np.array([0.8, 0.05, 0.05, 0.05, 0.05]) * shift
    words = np.array(["red", "shoes", "order", "where", "is", "my", "gift", "lights", "invoice", "tree"])
    return pd.DataFrame({
        "tool": rng.choice(tools, n, p=p), "workload_id": rng.choice(["search", "orders", "billing"], n),
        "country": rng.choice(["US", "DE", "GB", "IN"], n), "currency": rng.choice(["USD", "EUR", "GBP", "INR"], n),
        "channel": rng.choice(["web", "app"], n), "category": rng.choice(["toys", "home", "books"], n),
        "request_text": [" ".join(words[i:i + 3]) for i in rng.integers(0, 8, n)],
        "latency_ms": rng.lognormal(7 + shift, 0.4, n), "amount": rng.lognormal(4, 1, n),
        "feedback": rng.choice(["none", "up", "down"], n, p=[0.7, 0.2, 0.1])})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    cfg = load_settings().drift
    ref_frame, cur_frame = frame(args.records, 0), frame(args.records, 1, shift=0.5)
    started = time.perf_counter()
    ref = summarize(ref_frame, {}, cfg)
    cur = summarize(cur_frame, {"unknown_tool": 100}, cfg, edges=ref.numeric_edges)
    results = compare(ref, cur, cfg)
    seconds = time.perf_counter() - started
    t0 = time.perf_counter()
    from pipelines.embeddings import embed

    embedded = compare(ref, cur, cfg, (embed(ref.texts), embed(cur.texts)))
    emb_seconds = time.perf_counter() - t0
    print(f"{args.records:,} reference + {args.records:,} current records: summaries and {len(results)} signals in "
          f"{seconds:.1f} s ({2 * args.records / seconds:,.0f} records/s); embedding signal "
          f"({cfg.embedding_sample} texts per side) {emb_seconds:.1f} s")
    for r in embedded:
        print(f"  {r.signal:<28}{r.metric:<24}{r.value:>10g}  {r.band}")


if __name__ == "__main__":
    main()
