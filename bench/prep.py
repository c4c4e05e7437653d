"""Prep throughput: Spark (local[*]) vs the same transformation in DuckDB (one process), one run.

Both engines run the same per-record function (`prepare_line`: validate, quarantine reason, PII
redaction, SFT fields) and the same set logic (dedupe by normalized request + tool call, session
splits stratified by tool). Also times the Great Expectations gates on the largest window.

Usage: .venv/bin/python bench/prep.py [--sizes 100000 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa

from pipelines.config import load_settings
from pipelines.logs.raw import iter_lines, raw_files
from pipelines.prep.nodes import PREPARED_COLUMNS, prepare_line
from pipelines.prep.pipeline import run_prep
from pipelines.quality.gates import run_gates
from pipelines.simulate.generator import GeneratorConfig, write_raw_logs
from pipelines.window import DateWindow

END = date(2026, 11, 20)
DAYS = 7


def duckdb_prep(raw: Path, out: Path) -> dict[str, int]:
    rows = {c: [] for c in PREPARED_COLUMNS}
    for path in raw_files(raw):
        for line in iter_lines(path):
            for c, v in prepare_line(line, str(path)).items():
                rows[c].append(v)
    prepared_rows = pa.table(rows)  # noqa: F841 (DuckDB reads it by name)
    con = duckdb.connect()
    con.execute("SET threads TO 1")
    con.execute(
        "CREATE TABLE prepared AS SELECT *, try_cast(event_time AS TIMESTAMP) AS ts, "
        "regexp_extract(source_file, 'dt=([0-9-]{10})', 1) AS dt FROM prepared_rows"
    )
    con.execute("""
        CREATE TABLE marked AS SELECT *, row_number() OVER (PARTITION BY dedupe_key ORDER BY ts, record_id) AS rn
        FROM prepared WHERE status = 'clean'""")
    con.execute("""
        CREATE TABLE sessions AS SELECT session_id, tool AS stratum FROM (
          SELECT session_id, tool, row_number() OVER (PARTITION BY session_id ORDER BY turn_index, ts) AS n
          FROM marked WHERE rn = 1) WHERE n = 1""")
    con.execute("""
        CREATE TABLE splits AS SELECT session_id, CASE WHEN p >= 0.9 THEN 'test' WHEN p >= 0.8 THEN 'val'
          ELSE 'train' END AS split FROM (SELECT session_id, percent_rank() OVER (
          PARTITION BY stratum ORDER BY hash(session_id), session_id) AS p FROM sessions)""")
    out.mkdir(parents=True, exist_ok=True)
    con.execute(f"""COPY (SELECT m.*, s.split FROM marked m JOIN splits s USING (session_id) WHERE rn = 1)
                    TO '{out / "examples"}' (FORMAT parquet, PARTITION_BY (split, dt), OVERWRITE_OR_IGNORE)""")
    con.execute(f"""COPY (SELECT * FROM prepared WHERE status = 'quarantined')
                    TO '{out / "quarantine"}' (FORMAT parquet, PARTITION_BY (dt), OVERWRITE_OR_IGNORE)""")
    counts = dict(
        con.execute("""SELECT 'input', count(*) FROM prepared UNION ALL
        SELECT 'clean', count(*) FROM marked WHERE rn = 1 UNION ALL
        SELECT 'quarantined', count(*) FROM prepared WHERE status = 'quarantined' UNION ALL
        SELECT 'duplicates', count(*) FROM marked WHERE rn > 1""").fetchall()
    )
    return {k: int(v) for k, v in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pipelines.clients.spark import get_spark

    work = Path(tempfile.mkdtemp(prefix="bench-prep-"))
    results = []
    try:
        t = time.perf_counter()
        spark = get_spark(load_settings(root=str(work / "spark")))
        spark_start = time.perf_counter() - t
        print(f"Spark session start: {spark_start:.1f} s (not counted below); cores: {os.cpu_count()}")
        print(
            f"{'records':>10} {'engine':<8} {'seconds':>9} {'records/s':>11} {'clean':>9} {'quarantined':>12}"
            f" {'duplicates':>11}"
        )
        window = DateWindow.ending(END, DAYS)
        for n in args.sizes:
            root = work / f"n{n}"
            write_raw_logs(GeneratorConfig(seed=1, records=n, days=DAYS, end_date=END), root / "raw")
            settings = load_settings(root=str(root))
            t = time.perf_counter()
            r = run_prep(settings, window, spark=spark)
            spark_s = time.perf_counter() - t
            t = time.perf_counter()
            d = duckdb_prep(root / "raw", root / "duckdb")
            duck_s = time.perf_counter() - t
            assert d["input"] == r.input_records and d["clean"] == r.clean, (d, r)
            for engine, secs, c in (
                ("spark", spark_s, (r.clean, r.quarantined, r.duplicates)),
                ("duckdb", duck_s, (d["clean"], d["quarantined"], d["duplicates"])),
            ):
                print(f"{n:>10} {engine:<8} {secs:>9.1f} {n / secs:>11,.0f} {c[0]:>9} {c[1]:>12} {c[2]:>11}")
            print(f"{'':>10} spark/duckdb throughput ratio: {duck_s / spark_s:.2f}x")
            results.append(
                {
                    "records": n,
                    "spark_s": round(spark_s, 2),
                    "duckdb_s": round(duck_s, 2),
                    "spark_records_per_s": round(n / spark_s),
                    "duckdb_records_per_s": round(n / duck_s),
                    "ratio_spark_over_duckdb": round(duck_s / spark_s, 3),
                }
            )
        largest = work / f"n{args.sizes[-1]}"
        t = time.perf_counter()
        report = run_gates(load_settings(root=str(largest)), window, spark=spark, raise_on_failure=False)
        gate_s = time.perf_counter() - t
        print(
            f"Great Expectations gates on {args.sizes[-1]:,} raw lines (+ curated examples): {gate_s:.1f} s, "
            f"success={report.success}"
        )
        results.append({"ge_rows": args.sizes[-1], "ge_seconds": round(gate_s, 2), "ge_success": report.success})
        if args.json:
            args.json.write_text(json.dumps({"spark_start_s": round(spark_start, 1), "runs": results}, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
