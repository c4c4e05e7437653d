"""Log generator throughput (records/s, one process = one core), plain and gzip.

Usage: .venv/bin/python bench/generate.py [--records 200000]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from datetime import date
from pathlib import Path

from pipelines.simulate.generator import GeneratorConfig, write_raw_logs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-generate-"))
    try:
        print(f"{'output':<10}{'records':>10}{'seconds':>10}{'records/s':>12}{'MB':>10}")
        for compress in (False, True):
            target = out / ("gz" if compress else "plain")
            cfg = GeneratorConfig(seed=1, records=args.records, days=7, end_date=date(2026, 11, 20))
            s = write_raw_logs(cfg, target, compress=compress)
            size = sum(p.stat().st_size for p in target.rglob("*.jsonl*")) / 1e6
            print(
                f"{'jsonl.gz' if compress else 'jsonl':<10}{s.records:>10}{s.seconds:>10.2f}"
                f"{s.records_per_s:>12,.0f}{size:>10.1f}"
            )
    finally:
        shutil.rmtree(out)


if __name__ == "__main__":
    main()
