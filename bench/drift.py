"""Drift monitor throughput on raw log lines, end to end: what one check does to its window.

Generates raw logs with the project's generator (`write_raw_logs`, like `flywheel logs generate`) into
a temporary root: a reference window (the champion's training days) and the current day with holiday
drift. Then runs the monitor's own stages on the current day's raw lines, timed separately:

  parse      every raw line through `prepare_line` (the Spark job's per-line prep) -> clean rows
  summarize  category counts, decile bins, samples, health rates
  embed      MiniLM embeddings of the sampled request texts (drift.embedding_sample, independent of size)
  compare    every signal (PSI, Wasserstein, domain-classifier AUC, MMD) against the stored reference

The reference is built once per training window and stored (not part of an hourly check): its time is
printed apart.

Usage: .venv/bin/python bench/drift.py [--records 100000] [--reference-records 20000] [--workers N]
                                       [--chunk-lines N] [--keep DIR] [--new-hour 40000] [--out FILE]
With --new-hour N a file of N more lines then lands in the checked day (an hour of gateway captures) and the
check runs again: only the new file is parsed (each file's parse is kept by its content hash); both checks'
stage timings go to --out (JSON with commit, machine, settings, seeds).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import date
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="raw lines in the checked window")
    parser.add_argument("--reference-records", type=int, default=20_000, help="raw lines in the reference window")
    parser.add_argument("--workers", type=int, default=0, help="drift.parse_workers (0: physical cores)")
    parser.add_argument("--chunk-lines", type=int, default=20_000, help="drift.parse_chunk_lines")
    parser.add_argument("--keep", default=None, help="generate under this folder (kept) instead of a temp folder")
    parser.add_argument("--new-hour", type=int, default=0, help="then add a file of this many lines and check again")
    parser.add_argument("--out", default=None, help="the results JSON (both checks' timings)")
    args = parser.parse_args()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        run(Path(args.keep), args)
    else:
        with tempfile.TemporaryDirectory(prefix="flywheel-bench-drift-") as tmp:
            run(Path(tmp), args)


def run(root: Path, args: argparse.Namespace) -> None:
    from pipelines.config import load_settings
    from pipelines.drift.monitor import reference
    from pipelines.simulate.generator import Drift, GeneratorConfig, write_raw_logs
    from pipelines.window import DateWindow

    records, reference_records = args.records, args.reference_records
    day = date(2026, 11, 12)
    ref_window = DateWindow.parse("2026-11-08", "2026-11-10")
    started = time.perf_counter()
    write_raw_logs(
        GeneratorConfig(seed=1, records=reference_records, days=3, end_date=ref_window.end, bad_share=0.03),
        root / "raw",
    )
    write_raw_logs(
        GeneratorConfig(
            seed=3, records=records, end_date=day, bad_share=0.03, drift=Drift.HOLIDAY, drift_magnitude=0.8
        ),
        root / "raw",
    )
    generated = time.perf_counter() - started
    settings = load_settings(
        root=str(root), drift={"parse_workers": args.workers, "parse_chunk_lines": args.chunk_lines}
    )
    cfg = settings.drift

    t = time.perf_counter()
    ref_summary, ref_vectors = reference(settings, ref_window)  # parse + summarize + embed, stored once
    ref_seconds = time.perf_counter() - t

    timings, clean, reasons, lines, results = _check(settings, day, ref_summary, ref_vectors)
    total = sum(timings.values())
    print(
        f"generated {reference_records:,} reference + {records:,} current raw lines in {generated:.1f} s under {root}"
    )
    print(
        f"reference window {ref_window} (one-off, then stored): {ref_summary.records:,} clean records in "
        f"{ref_seconds:.1f} s"
    )
    print(f"check of {day}: {lines:,} raw lines -> {len(clean):,} clean, {sum(reasons.values()):,} quarantined")
    print(f"  {'stage':<10}{'seconds':>10}{'lines/s':>14}")
    for stage, seconds in [*timings.items(), ("total", total)]:
        note = f"  ({cfg.embedding_sample} texts)" if stage == "embed" else ""
        print(f"  {stage:<10}{seconds:>10.2f}{lines / seconds if seconds else float('inf'):>14,.0f}{note}")
    per_line = (timings["parse"] + timings["summarize"]) / max(lines, 1)  # embed and compare: fixed samples
    print(
        f"  -> a 1M-line window: about {(per_line * 1_000_000 + timings['embed'] + timings['compare']) / 60:.1f} "
        f"min (parse {timings['parse'] / total:.0%} of this run; {cfg.parse_workers or 'auto'} parse workers, "
        f"{cfg.parse_chunk_lines:,} lines per chunk)"
    )
    acting = [r for r in results if r.band == "act"]
    print(
        f"verdict: {'act' if acting else 'no act-level signal'}; "
        + ", ".join(f"{r.signal} {r.metric} {r.value:g}" for r in acting)
    )
    checks = [{"check": "cold", "lines": lines, "clean": len(clean), "seconds": timings}]
    if args.new_hour:
        hour = GeneratorConfig(
            seed=9, records=args.new_hour, end_date=day, bad_share=0.03, drift=Drift.HOLIDAY, drift_magnitude=0.8
        )
        write_raw_logs(hour, root / "raw-hour")
        for path in (root / "raw-hour").rglob("*.jsonl*"):
            path.rename(root / "raw" / f"dt={day}" / f"gateway-hour-{path.name}")
        warm, clean, _, lines, _ = _check(settings, day, ref_summary, ref_vectors)
        print(f"after {args.new_hour:,} new lines: {lines:,} lines, check {sum(warm.values()):.2f} s {warm}")
        checks.append(
            {"check": "one new file", "new_lines": args.new_hour, "lines": lines, "clean": len(clean), "seconds": warm}
        )
    if args.out:
        _write(args, settings, checks)


def _check(settings, day, ref_summary, ref_vectors):
    """One check's stages, timed: (seconds by stage, clean rows, reasons, lines, signal results)."""
    from pipelines.drift.monitor import parse_window
    from pipelines.drift.signals import compare, summarize
    from pipelines.embeddings import embed
    from pipelines.window import DateWindow

    cfg = settings.drift
    timings: dict[str, float] = {}
    t = time.perf_counter()
    clean, reasons, lines = parse_window(settings, DateWindow.ending(day, cfg.window_days))
    timings["parse"] = time.perf_counter() - t
    t = time.perf_counter()
    current = summarize(clean, reasons, cfg, edges=ref_summary.numeric_edges)
    timings["summarize"] = time.perf_counter() - t
    t = time.perf_counter()
    vectors = embed(current.texts)
    timings["embed"] = time.perf_counter() - t
    t = time.perf_counter()
    results = compare(ref_summary, current, cfg, (ref_vectors, vectors))
    timings["compare"] = time.perf_counter() - t
    return {k: round(v, 3) for k, v in timings.items()}, clean, reasons, lines, results


def _write(args, settings, checks) -> None:
    import json
    import os
    import subprocess
    from datetime import UTC, datetime

    from pipelines.hardware import cpu_model

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    report = {
        "benchmark": "drift_check",
        "what": "the drift monitor's check of a day of raw logs, cold, then after one new file lands",
        "commit": {
            "sha": commit,
            "dirty": bool(
                subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
            ),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "argv": ["bench/drift.py", "--records", str(args.records), "--new-hour", str(args.new_hour)],
        "settings": settings.drift.model_dump(mode="json"),
        "seeds": {"reference": 1, "checked_day": 3, "new_file": 9},
        "checks": checks,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
