"""`flywheel demo`: the whole flywheel on embedded defaults, narrated, with every output's location."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipelines.config import Settings
from pipelines.logs.generator import GeneratorConfig, write_raw_logs
from pipelines.logs.raw import check_files, raw_files


def run_demo(settings: Settings, *, records_per_day: int, days: int, seed: int, console: Console) -> dict[str, str]:
    started = time.perf_counter()
    raw_root = Path(settings.zone("raw"))
    end = datetime.now(timezone.utc).date()
    outputs: dict[str, str] = {}

    console.rule("1. ingest: synthetic commerce-agent logs")
    summary = write_raw_logs(
        GeneratorConfig(seed=seed, records=records_per_day * days, days=days, end_date=end), raw_root)
    console.print(f"{summary.records} records over {days} days ({summary.records_per_s:,.0f} records/s); "
                  f"kinds: {summary.kinds}")
    outputs["raw logs"] = str(raw_root)

    console.rule("2. schema check of the raw zone")
    check = check_files(raw_files(raw_root, GeneratorConfig(days=days, end_date=end).day_list()))
    console.print(f"{check.valid}/{check.lines} lines valid; would be quarantined: {check.reasons}")

    table = Table(title=f"demo finished in {time.perf_counter() - started:.0f} s", show_header=True)
    table.add_column("output")
    table.add_column("where")
    for name, where in outputs.items():
        table.add_row(name, where)
    console.print(table)
    return outputs
