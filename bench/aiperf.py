"""NVIDIA AIPerf against the gateway's OpenAI endpoint: tuned champion vs base + few-shot, streamed
(`pipelines.bench.aiperf`; the same as `flywheel bench --aiperf`), with the result committed.

Usage (a root where `make demo` ran: Triton up with a live champion):
  make aiperf-env
  FLYWHEEL_ROOT=.flywheel .venv/bin/python bench/aiperf.py [--requests 24] [--concurrency 1,2,4]
      [--models champion,base]
Writes bench/results/aiperf.json (AIPerf's own exports and an HTML report under <root>/reports/aiperf/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--models", default="champion,base")
    parser.add_argument("--timeout-s", type=float, default=900, help="limit for each AIPerf run")
    args = parser.parse_args()

    from pipelines.bench.aiperf import AiperfFailed, run_aiperf
    from pipelines.config import load_settings

    try:
        report = run_aiperf(
            load_settings(),
            args.requests,
            [int(c) for c in args.concurrency.split(",")],
            tuple(args.models.split(",")),
            args.timeout_s,
            say=lambda line: print(line, flush=True),
        )
    except AiperfFailed as exc:
        raise SystemExit(f"error: {exc}") from None
    out = REPO / "bench" / "results" / "aiperf.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {out} (HTML: {report['html_uri']})")


if __name__ == "__main__":
    main()
