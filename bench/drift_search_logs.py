"""Real-world check of the drift monitor's text signals on public search logs (../shared/data/search_logs):
Amazon queries (ESCI, via OpenSearch's UBI sample) against Wayfair queries (WANDS) must be flagged as
drift, and two random halves of one source must not. Same metrics and act thresholds as the monitor
(`drift.auc_act` for the MiniLM embedding domain classifier, `drift.psi_act` for query length).

Usage: .venv/bin/python bench/drift_search_logs.py [--data ../shared/data/search_logs] [--sample 400]
Exits 1 when a verdict is wrong.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

from pipelines.config import load_settings
from pipelines.drift import metrics
from pipelines.embeddings import embed


def amazon_queries(folder: Path) -> list[str]:
    queries = []
    for line in (folder / "esci_opensearch" / "ubi_queries_events.ndjson").read_text().splitlines():
        record = json.loads(line)
        if "user_query" in record:  # the bulk-index lines carry only {"index": ...}
            queries.append(record["user_query"])
    return sorted(set(queries))


def wayfair_queries(folder: Path) -> list[str]:
    with (folder / "wands" / "query.csv").open(newline="") as handle:
        return sorted({row["query"] for row in csv.DictReader(handle, delimiter="\t")})


def compare(name: str, a: list[str], b: list[str], cfg) -> dict:
    va, vb = embed(a), embed(b)
    la, lb = np.array([len(q) for q in a], float), np.array([len(q) for q in b], float)
    edges = metrics.quantile_edges(la, cfg.numeric_bins)
    length_psi = metrics.psi(metrics.binned_counts(la, edges), metrics.binned_counts(lb, edges))
    auc = metrics.classifier_auc(va, vb)
    return {
        "pair": name,
        "n": f"{len(a)} vs {len(b)}",
        "embedding_auc": round(auc, 3),
        "mmd_rbf": round(metrics.mmd_rbf(va, vb), 5),
        "length_psi": round(length_psi, 3),
        "flagged": auc >= cfg.auc_act or length_psi >= cfg.psi_act,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "search_logs"))
    parser.add_argument("--sample", type=int, default=400)
    args = parser.parse_args()
    cfg = load_settings().drift
    folder = Path(args.data)
    rng = random.Random(0)
    amazon, wayfair = amazon_queries(folder), wayfair_queries(folder)
    amazon_s = rng.sample(amazon, min(args.sample, len(amazon)))
    wayfair_s = rng.sample(wayfair, min(args.sample, len(wayfair)))

    def halves(items: list[str]) -> tuple[list[str], list[str]]:
        shuffled = items[:]
        rng.shuffle(shuffled)
        return shuffled[: len(shuffled) // 2], shuffled[len(shuffled) // 2 :]

    started = time.perf_counter()
    rows = [
        (compare("Amazon vs Wayfair", amazon_s, wayfair_s, cfg), True),
        (compare("Amazon: random halves", *halves(amazon_s), cfg), False),
        (compare("Wayfair: random halves", *halves(wayfair_s), cfg), False),
    ]
    print(
        f"{len(amazon)} Amazon queries, {len(wayfair)} Wayfair queries; act thresholds: embedding AUC >= "
        f"{cfg.auc_act}, length PSI >= {cfg.psi_act}"
    )
    print(f"{'pair':<26}{'n':>12}{'AUC':>8}{'MMD':>10}{'len PSI':>9}  flagged  expected")
    wrong = 0
    for row, expected in rows:
        wrong += row["flagged"] != expected
        print(
            f"{row['pair']:<26}{row['n']:>12}{row['embedding_auc']:>8}{row['mmd_rbf']:>10}{row['length_psi']:>9}"
            f"  {str(row['flagged']):<8} {expected}"
        )
    print(f"{time.perf_counter() - started:.1f} s; {'all verdicts right' if not wrong else f'{wrong} wrong'}")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
