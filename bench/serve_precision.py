"""`flywheel bench --precisions fp32,bf16,auto`, written as a results file: the live version served at each precision
through the running Triton server, side by side on the same test-split requests at each concurrency (every request
streamed: TTFT, ITL, throughput), exact match paired per request against fp32, wrong writes counted per side.

Usage (a root where `make demo` ran: a live champion; the stack up, `flywheel up`):
  FLYWHEEL_ROOT=.flywheel .venv/bin/python bench/serve_precision.py [--requests 96] [--concurrency 1,4,8]
      [--precisions fp32,bf16,auto] [--out bench/results/serving_precision_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--precisions", default="fp32,bf16,auto")
    parser.add_argument("--out", default="bench/results/serving_precision_cpu.json")
    args = parser.parse_args()

    from rich.console import Console

    from pipelines.bench.report import precision_lines
    from pipelines.bench.serving import run_bench
    from pipelines.config import BenchSettings, load_settings
    from pipelines.hardware import cpu_model

    settings = load_settings()
    cfg = BenchSettings(
        **{
            **settings.bench.model_dump(),
            "requests": args.requests,
            "concurrency": [int(c) for c in args.concurrency.split(",")],
            "precisions": args.precisions.split(","),
            "direct": False,
            "baseline": False,  # the live version's precisions against each other: the few-shot base is not timed
        }
    )
    report = run_bench(settings, cfg, console=Console(stderr=True))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip())
    result = {
        "benchmark": "serving_precision",
        "what": "the live version served at each precision through Triton, same requests, paired against fp32",
        "commit": {"sha": commit, "dirty": dirty},
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "argv": ["bench/serve_precision.py", *sys.argv[1:]],
        "settings": {
            "bench": cfg.model_dump(mode="json", exclude={"hardware"}),
            "triton": settings.triton.model_dump(
                mode="json",
                include={
                    "threads",
                    "instances",
                    "max_batch_size",
                    "queue_delay_us",
                    "precision",
                    "bf16_min_rows",
                    "constrained",
                },
            ),
        },
        "seeds": "none: greedy decoding; the requests are the first of the test split",
        **{
            k: report[k]
            for k in ("live", "version", "requests", "served_precision", "constrained", "runs", "precision", "seconds")
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for line in precision_lines(report):
        print(line)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
