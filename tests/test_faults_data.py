"""Raw files gone wrong next to a good one: a line cut in the middle, an empty file, a corrupt or
truncated gzip, and a file ten times the usual size. Prep (real Spark, local mode) loses nothing and
says what happened in one clear message; the drift monitor's parse skips a corrupt gzip and goes on."""

from __future__ import annotations

import gzip
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest
from data_path import END

from pipelines.config import load_settings
from pipelines.prep.pipeline import PrepError, run_prep
from pipelines.simulate.generator import EXPECTED_REASON, GeneratorConfig, Kind, write_raw_logs
from pipelines.storage import read_json
from pipelines.window import DateWindow

pytestmark = pytest.mark.slow
GOOD = 300  # the good file's lines


def _good_window(root: Path, day, records: int = GOOD, compress: bool = True) -> int:
    summary = write_raw_logs(
        GeneratorConfig(seed=11, records=records, days=1, end_date=day, bad_share=0.0), root / "raw", compress=compress
    )
    assert summary.records == records
    return records


def _other_lines(tmp_path: Path, day, records: int, seed: int = 23, bad_share: float = 0.0):
    """Lines of another generation (seed `seed`) and its summary, to plant as the bad file."""
    summary = write_raw_logs(
        GeneratorConfig(seed=seed, records=records, days=1, end_date=day, bad_share=bad_share),
        tmp_path / f"other-{seed}",
    )
    data = (tmp_path / f"other-{seed}" / f"dt={day.isoformat()}" / f"generated-seed{seed}.jsonl").read_bytes()
    return data, summary


def _reconciled(result) -> dict:
    manifest = read_json(result.manifest_uri)
    assert manifest["counts"]["reconciled"] is True
    assert result.clean + result.held + result.quarantined + result.duplicates == result.input_records
    return manifest


def test_a_line_cut_in_the_middle_is_quarantined_as_bad_json(tmp_path: Path, spark) -> None:
    day = END - timedelta(days=40)
    good = _good_window(tmp_path, day)
    data, _ = _other_lines(tmp_path, day, 40)
    lines = data.rstrip(b"\n").split(b"\n")
    cut = b"\n".join(lines[:-1]) + b"\n" + lines[-1][: len(lines[-1]) // 2]  # ends mid-line, no newline
    (tmp_path / "raw" / f"dt={day}" / "cut.jsonl").write_bytes(cut)

    result = run_prep(load_settings(root=str(tmp_path)), DateWindow(day, day), spark=spark)
    manifest = _reconciled(result)
    assert result.input_records == good + 40
    assert result.reasons == {"bad_json": 1}, result.reasons
    assert manifest["unreadable_files"] == [] and "unreadable" not in result.message
    quarantine = pd.read_parquet(tmp_path / "quarantine" / "records")
    bad = quarantine[quarantine["reason"] == "bad_json"]
    assert len(bad) == 1 and bad["source_file"].iloc[0].endswith("/cut.jsonl")
    assert lines[-1][:40].decode() in bad["raw_redacted"].iloc[0]


def test_an_empty_file_is_zero_lines(tmp_path: Path, spark) -> None:
    day = END - timedelta(days=41)
    good = _good_window(tmp_path, day)
    (tmp_path / "raw" / f"dt={day}" / "empty.jsonl").write_bytes(b"")
    (tmp_path / "raw" / f"dt={day}" / "empty.jsonl.gz").write_bytes(b"")  # a 0-byte gzip: no stream, no lines

    result = run_prep(load_settings(root=str(tmp_path)), DateWindow(day, day), spark=spark)
    manifest = _reconciled(result)
    assert result.input_records == good and result.quarantined == 0
    assert manifest["unreadable_files"] == []
    assert {f.rsplit("/", 1)[1] for f in manifest["input_files"]} == {
        "generated-seed11.jsonl.gz",
        "empty.jsonl",
        "empty.jsonl.gz",
    }


def _corrupt_gzips(tmp_path: Path, day) -> dict[str, bytes]:
    """A gzip cut mid-stream and one with flipped bytes mid-stream, next to the good file."""
    data, _ = _other_lines(tmp_path, day, 200)
    packed = gzip.compress(data, mtime=0)
    flipped = bytearray(packed)
    for i in range(len(flipped) // 2, len(flipped) // 2 + 8):
        flipped[i] ^= 0x5A
    files = {"cut.jsonl.gz": packed[: len(packed) // 2], "flipped.jsonl.gz": bytes(flipped)}
    for name, content in files.items():
        (tmp_path / "raw" / f"dt={day}" / name).write_bytes(content)
    return files


def test_a_corrupt_gzip_is_recorded_as_unreadable_and_left_in_place(tmp_path: Path, spark) -> None:
    """The good file is prepared; each corrupt gzip is named in the message and in the manifest's
    `unreadable_files` with its reason, none of its lines counted, and its bytes left as they were."""
    day = END - timedelta(days=42)
    good = _good_window(tmp_path, day)
    corrupt = _corrupt_gzips(tmp_path, day)

    result = run_prep(load_settings(root=str(tmp_path)), DateWindow(day, day), spark=spark)
    manifest = _reconciled(result)
    assert result.input_records == good and result.quarantined == 0
    unreadable = {u["file"].rsplit("/", 1)[1]: u["reason"] for u in manifest["unreadable_files"]}
    assert set(unreadable) == set(corrupt) == {f.rsplit("/", 1)[1] for f in result.unreadable_files}
    assert all("gzip" in reason for reason in unreadable.values()), unreadable
    assert "EOFError" in unreadable["cut.jsonl.gz"]
    assert "2 unreadable raw file(s)" in result.message and all(name in result.message for name in corrupt)
    assert not any(f.endswith(tuple(corrupt)) for f in manifest["input_files"])
    for name, content in corrupt.items():  # raw is immutable: nothing moved, nothing rewritten
        assert (tmp_path / "raw" / f"dt={day}" / name).read_bytes() == content


def test_a_window_of_only_corrupt_gzips_fails_clearly_and_keeps_the_last_outputs(tmp_path: Path, spark) -> None:
    day = END - timedelta(days=43)
    settings = load_settings(root=str(tmp_path))
    _good_window(tmp_path, day)
    first = run_prep(settings, DateWindow(day, day), spark=spark)
    examples = pd.read_parquet(tmp_path / "curated" / "examples")
    (tmp_path / "raw" / f"dt={day}" / "generated-seed11.jsonl.gz").unlink()
    _corrupt_gzips(tmp_path, day)

    with pytest.raises(PrepError) as failure:
        run_prep(settings, DateWindow(day, day), spark=spark)
    message = str(failure.value)
    assert message.startswith(f"every raw file of {day}..{day} is unreadable") and "cut.jsonl.gz" in message
    assert "flipped.jsonl.gz" in message and "Py4J" not in message and "at org.apache" not in message
    assert len(message) < 1000
    assert pd.read_parquet(tmp_path / "curated" / "examples").equals(examples)
    assert read_json(first.manifest_uri)["run_id"] == first.run_id


def test_the_drift_parse_skips_a_corrupt_gzip_and_counts_it(tmp_path: Path) -> None:
    from pipelines.drift.monitor import parse_window

    day = END - timedelta(days=44)
    good = _good_window(tmp_path, day)
    _corrupt_gzips(tmp_path, day)
    clean, reasons, lines = parse_window(
        load_settings(root=str(tmp_path), drift={"parse_workers": 1}), DateWindow(day, day)
    )
    assert lines == good and len(clean) == good
    assert reasons == {"unreadable_file": 2}


def test_a_file_ten_times_the_usual_size_reconciles(tmp_path: Path, spark) -> None:
    day = END - timedelta(days=45)
    good = _good_window(tmp_path, day, records=1500, compress=False)
    data, summary = _other_lines(tmp_path, day, 15_000, seed=29, bad_share=0.05)
    (tmp_path / "raw" / f"dt={day}" / "big.jsonl").write_bytes(data)

    result = run_prep(load_settings(root=str(tmp_path)), DateWindow(day, day), spark=spark)
    manifest = _reconciled(result)
    assert result.input_records == good + 15_000 == good + summary.records
    expected: dict[str, int] = {}
    for kind, n in summary.kinds.items():
        reason = EXPECTED_REASON[Kind(kind)]
        if reason is not None:
            expected[reason.value] = expected.get(reason.value, 0) + n
    assert result.reasons == dict(sorted(expected.items()))
    assert sum(manifest["examples_by_split"].values()) == result.clean
    assert len(pd.read_parquet(tmp_path / "curated" / "examples")) == result.clean
    assert len(pd.read_parquet(tmp_path / "quarantine" / "records")) == result.quarantined + result.duplicates
