"""Generated traffic written into date partitions of the raw zone (gzip optional), with a summary."""

from __future__ import annotations

import gzip
import os
import time
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)
from pipelines.logs.tools import (
    NO_TOOL,
)
from pipelines.simulate.generator.config import (
    Drift,
    GenerationSummary,
    GeneratorConfig,
    Kind,
)
from pipelines.simulate.generator.traffic import TrafficGenerator


def partition_dir(raw_root: Path, day: date) -> Path:
    return raw_root / f"dt={day.isoformat()}"


def write_raw_logs(
    config: GeneratorConfig, raw_root: Path, *, compress: bool = False, progress: Callable[[int], None] | None = None
) -> GenerationSummary:
    """Generate traffic and write one JSONL file per date partition under `raw_root`.

    The file name carries the seed, so re-running the same generation replaces its own files
    (idempotent) and never touches other sources' files in the partition. Writes are atomic.
    """
    started = time.perf_counter()
    gen = TrafficGenerator(config)
    kinds: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    days: Counter[str] = Counter()
    files: list[str] = []
    suffix = ".jsonl.gz" if compress else ".jsonl"
    current: date | None = None
    handle: Any = None
    tmp_path: Path | None = None
    final_path: Path | None = None
    buffer: list[bytes] = []

    def close() -> None:
        if handle is not None:
            if tmp_path is None or final_path is None:  # set with the handle
                raise RuntimeError("an open raw file without its path")
            handle.write(b"".join(buffer))
            buffer.clear()
            handle.close()
            os.replace(tmp_path, final_path)

    # Empty days still get an (empty) file, so "no traffic" is distinguishable from "not ingested".
    for day in config.day_list():
        partition_dir(raw_root, day).mkdir(parents=True, exist_ok=True)
    try:
        for n, (day, line, kind) in enumerate(gen.lines(), 1):
            if day != current:
                close()
                current = day
                final_path = partition_dir(raw_root, day) / f"generated-seed{config.seed}{suffix}"
                tmp_path = final_path.with_name(f".{final_path.name}.tmp")
                handle = gzip.GzipFile(tmp_path, "wb", compresslevel=5, mtime=0) if compress else open(tmp_path, "wb")  # noqa: SIM115 (closed by close())
                files.append(str(final_path))
            buffer.append(line)
            buffer.append(b"\n")
            if len(buffer) >= 4096:
                handle.write(b"".join(buffer))
                buffer.clear()
            kinds[kind.value] += 1
            days[day.isoformat()] += 1
            if kind is Kind.GOOD:
                tools[_tool_of(line)] += 1
            if progress is not None and n % 1000 == 0:
                progress(1000)
        close()
        handle = None
    finally:
        if handle is not None:
            handle.close()
    for day in config.day_list():
        path = partition_dir(raw_root, day) / f"generated-seed{config.seed}{suffix}"
        if not path.exists():
            _write_empty(path, compress)
            files.append(str(path))
    elapsed = time.perf_counter() - started
    return GenerationSummary(
        seed=config.seed,
        records=sum(kinds.values()),
        drift=config.drift.value,
        drift_magnitude=config.drift_magnitude if config.drift is not Drift.NONE else 0.0,
        bad_share=config.bad_share,
        kinds=dict(sorted(kinds.items())),
        tools=dict(sorted(tools.items())),
        days=dict(sorted(days.items())),
        files=sorted(files),
        seconds=round(elapsed, 3),
        records_per_s=round(sum(kinds.values()) / elapsed, 1) if elapsed > 0 else 0.0,
        slipped=gen.slipped,
    )


def _write_empty(path: Path, compress: bool) -> None:
    if compress:
        with gzip.GzipFile(path, "wb", mtime=0):
            pass
    else:
        path.write_bytes(b"")


_TOOL_MARK = b'"tool_calls":[{"id":"'


def _tool_of(line: bytes) -> str:
    """Tool name of a good line without re-parsing it (the last tool call is the response's)."""
    i = line.rfind(_TOOL_MARK)
    j = line.rfind(b'"finish_reason":"')
    if i < 0 or line[j + 17 : j + 21] == b"stop":
        return NO_TOOL
    k = line.find(b'"name":"', i) + 8
    return line[k : line.find(b'"', k)].decode()
