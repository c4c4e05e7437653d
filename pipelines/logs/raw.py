"""The raw zone on disk: date partitions of JSONL (optionally gzip) files, read line by line."""

from __future__ import annotations

import gzip
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

from pipelines.logs.schema import check_line

RAW_PATTERNS = ("*.jsonl", "*.jsonl.gz")


def raw_files(raw_root: Path, dates: list[date] | None = None) -> list[Path]:
    """Data files of the given partitions (all partitions when `dates` is None), in a stable order."""
    dirs = [raw_root / f"dt={d.isoformat()}" for d in dates] if dates is not None else sorted(raw_root.glob("dt=*"))
    files: list[Path] = []
    for d in dirs:
        for pattern in RAW_PATTERNS:
            files.extend(sorted(d.glob(pattern)))
    return files


def iter_lines(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        for line in fh:
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield line


def unreadable_reason(uri: str) -> str | None:
    """Why a raw file cannot be read whole (None: it can): a `.gz` file is decompressed to its end with
    Python's gzip (through fsspec: local paths and s3:// alike), so a corrupt or truncated stream is
    found before Spark or the monitor would fail on it mid-job. Plain files are not opened (a cut line
    in one is just a `bad_json` record)."""
    import zlib

    import fsspec

    if not uri.endswith(".gz"):
        return None
    try:
        with fsspec.open(uri, "rb", compression="gzip") as handle:
            while handle.read(1 << 20):
                pass
    except FileNotFoundError:
        raise
    except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        return f"corrupt or truncated gzip ({type(exc).__name__}: {exc})"
    return None


@dataclass
class RawCheck:
    files: int = 0
    lines: int = 0
    valid: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_files(files: list[Path]) -> RawCheck:
    """Schema-check raw files without Spark (quick look; prep does the real, counted split)."""
    reasons: Counter[str] = Counter()
    result = RawCheck(files=len(files))
    for path in files:
        for line in iter_lines(path):
            result.lines += 1
            verdict = check_line(line)
            if verdict.reason is None:  # ok
                result.valid += 1
            else:
                reasons[verdict.reason.value] += 1
                result.examples.setdefault(verdict.reason.value, verdict.detail)
    result.reasons = dict(sorted(reasons.items()))
    return result
