"""Prep throughput: Spark (local[*]) vs the same transformation in DuckDB, side by side, with peak memory.

Both engines run the same per-record function (`prepare_line`: validate, quarantine reason, PII
redaction, SFT fields) and the same set logic (dedupe by normalized request + tool call, session
splits stratified by tool), on the same cores: Spark's local[*] threads, and for DuckDB one worker
process per core running `prepare_line` over the raw files (streamed to Parquet in batches, so memory
stays bounded at any size) before DuckDB's own threads run the set logic. Both engines must agree on
every count. Peak memory is the resident set of the process tree, sampled while each engine runs:
Spark's JVM and its Python workers for Spark, the bench and its workers for DuckDB. Also times the
Great Expectations gates on one size's window.

Usage: .venv/bin/python bench/prep.py [--sizes 100000 1000000] [--gates-size N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, date, datetime
from pathlib import Path

import duckdb
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.config import load_settings
from pipelines.logs.raw import iter_lines, raw_files
from pipelines.prep.nodes import PREPARED_COLUMNS, PREPARED_SCHEMA, prepare_line
from pipelines.prep.pipeline import run_prep
from pipelines.quality.gates import run_gates
from pipelines.simulate.generator import GeneratorConfig, write_raw_logs
from pipelines.window import DateWindow

END = date(2026, 11, 20)
DAYS = 7
SEED = 1
BATCH = 50_000
ARROW_TYPES = {"string": pa.string(), "double": pa.float64(), "int": pa.int32(), "array<string>": pa.list_(pa.string())}
ARROW_SCHEMA = pa.schema([(c.split(" ")[0], ARROW_TYPES[c.split(" ", 1)[1]]) for c in PREPARED_SCHEMA.split(", ")])


class PeakMemory:
    """The largest resident set of this process tree seen while a block runs, split JVM / not JVM.

    A sampler, not a synchronisation: it reads psutil every `interval` seconds and stops when told.
    """

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.peak_all = 0
        self.peak_jvm = 0
        self.peak_python = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        jvm = python = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                rss = p.memory_info().rss
                is_jvm = p.name() == "java"
            except psutil.Error:
                continue
            if is_jvm:
                jvm += rss
            else:
                python += rss
        self.peak_all = max(self.peak_all, jvm + python)
        self.peak_jvm = max(self.peak_jvm, jvm)
        self.peak_python = max(self.peak_python, python)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sample()


def _prepare_file(path: str, out: str) -> int:
    """One worker's share: `prepare_line` over one raw file, written to Parquet in batches of BATCH rows."""
    rows: dict[str, list] = {c: [] for c in PREPARED_COLUMNS}
    n = 0
    with pq.ParquetWriter(out, ARROW_SCHEMA) as writer:
        for line in iter_lines(Path(path)):
            for c, v in prepare_line(line, path).items():
                rows[c].append(v)
            n += 1
            if len(rows["status"]) >= BATCH:
                writer.write_table(pa.table(rows, schema=ARROW_SCHEMA))
                rows = {c: [] for c in PREPARED_COLUMNS}
        if rows["status"]:
            writer.write_table(pa.table(rows, schema=ARROW_SCHEMA))
    return n


def duckdb_prep(raw: Path, out: Path, workers: int) -> dict[str, int]:
    staged = out / "prepared"
    staged.mkdir(parents=True, exist_ok=True)
    files = [str(p) for p in raw_files(raw)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        list(pool.map(_prepare_file, files, [str(staged / f"part-{i:05d}.parquet") for i in range(len(files))]))
    # a database file, so a table larger than memory lives on disk (an in-memory one would not fit at 10M)
    con = duckdb.connect(str(out / "prep.duckdb"))
    con.execute(f"SET threads TO {workers}")
    con.execute(f"SET temp_directory = '{out / 'spill'}'")
    con.execute(
        "CREATE VIEW prepared AS SELECT *, try_cast(event_time AS TIMESTAMP) AS ts, "
        f"regexp_extract(source_file, 'dt=([0-9-]{{10}})', 1) AS dt FROM read_parquet('{staged}/*.parquet')"
    )
    con.execute("""
        CREATE TABLE marked AS SELECT *, row_number() OVER (PARTITION BY dedupe_key
          ORDER BY held IS NOT NULL, ts, record_id, source_file) AS rn
        FROM prepared WHERE status = 'clean'""")
    con.execute("""
        CREATE TABLE sessions AS SELECT session_id, tool AS stratum FROM (
          SELECT session_id, tool, row_number() OVER (PARTITION BY session_id ORDER BY turn_index, ts) AS n
          FROM marked WHERE rn = 1 AND held IS NULL) WHERE n = 1""")
    con.execute("""
        CREATE TABLE splits AS SELECT session_id, CASE WHEN p >= 0.9 THEN 'test' WHEN p >= 0.8 THEN 'val'
          ELSE 'train' END AS split FROM (SELECT session_id, percent_rank() OVER (
          PARTITION BY stratum ORDER BY hash(session_id), session_id) AS p FROM sessions)""")
    # the same three tables as Spark's prep: examples (kept rows that train), clean logs (every kept row),
    # quarantine (bad rows and duplicates)
    con.execute(f"""COPY (SELECT m.*, s.split FROM marked m JOIN splits s USING (session_id)
                          WHERE rn = 1 AND held IS NULL)
                    TO '{out / "examples"}' (FORMAT parquet, PARTITION_BY (split, dt), OVERWRITE_OR_IGNORE)""")
    con.execute(f"""COPY (SELECT * FROM marked WHERE rn = 1)
                    TO '{out / "clean_logs"}' (FORMAT parquet, PARTITION_BY (dt), OVERWRITE_OR_IGNORE)""")
    con.execute(f"""COPY (SELECT * EXCLUDE (rn) FROM marked WHERE rn > 1 UNION ALL BY NAME
                          SELECT * FROM prepared WHERE status = 'quarantined')
                    TO '{out / "quarantine"}' (FORMAT parquet, PARTITION_BY (dt), OVERWRITE_OR_IGNORE)""")
    counts = dict(
        con.execute("""SELECT 'input', count(*) FROM prepared UNION ALL
        SELECT 'clean', count(*) FROM marked WHERE rn = 1 AND held IS NULL UNION ALL
        SELECT 'held', count(*) FROM marked WHERE rn = 1 AND held IS NOT NULL UNION ALL
        SELECT 'quarantined', count(*) FROM prepared WHERE status = 'quarantined' UNION ALL
        SELECT 'duplicates', count(*) FROM marked WHERE rn > 1""").fetchall()
    )
    con.close()
    return {k: int(v) for k, v in counts.items()}


def _mib(n: int) -> int:
    return round(n / 2**20)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--gates-size", type=int, help="the size whose window the GE gates check (default: the largest)"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DuckDB's prepare_line processes")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gates_size = args.gates_size or args.sizes[-1]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pipelines.clients.spark import get_spark
    from pipelines.hardware import cpu_model

    work = Path(tempfile.mkdtemp(prefix="bench-prep-"))
    base_settings = load_settings(root=str(work / "spark"))
    report: dict = {
        "benchmark": "prep",
        "what": "prep on Spark (local[*]) against the same per-record function and set logic on DuckDB "
        f"({args.workers} prepare_line processes, then DuckDB's threads), by record count, with peak memory",
        "commit": {"sha": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))},
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30),
        },
        "argv": ["bench/prep.py", *sys.argv[1:]],
        "seeds": {"generator": SEED},
        "settings": {
            "days": DAYS,
            "end_date": END.isoformat(),
            "duckdb_workers": args.workers,
            "spark": base_settings.spark.model_dump(mode="json"),
            "spark_driver_memory": "2g",
        },
        "runs": [],
    }

    def write() -> None:
        if args.json:
            partial = args.json.with_name(f".{args.json.name}.{os.getpid()}.tmp")
            partial.write_text(json.dumps(report, indent=1) + "\n")
            os.replace(partial, args.json)

    try:
        t = time.perf_counter()
        spark = get_spark(base_settings)
        report["spark_start_s"] = round(time.perf_counter() - t, 1)
        print(
            f"Spark session start: {report['spark_start_s']} s (not counted below); cores: {os.cpu_count()}", flush=True
        )
        window = DateWindow.ending(END, DAYS)
        for n in args.sizes:
            root = work / f"n{n}"
            t = time.perf_counter()
            write_raw_logs(GeneratorConfig(seed=SEED, records=n, days=DAYS, end_date=END), root / "raw")
            gen_s = time.perf_counter() - t
            raw_bytes = sum(p.stat().st_size for p in raw_files(root / "raw"))
            print(f"{n:,} records generated in {gen_s:.0f} s ({raw_bytes / 2**20:,.0f} MiB raw)", flush=True)
            settings = load_settings(root=str(root))
            with PeakMemory() as spark_mem:
                t = time.perf_counter()
                r = run_prep(settings, window, spark=spark)
                spark_s = time.perf_counter() - t
            print(f"{n:,} spark: {spark_s:.1f} s, peak {_mib(spark_mem.peak_all):,} MiB", flush=True)
            gates = None
            if n == gates_size:
                t = time.perf_counter()
                gates = run_gates(settings, window, spark=spark, raise_on_failure=False)
                gate_s = time.perf_counter() - t
                print(
                    f"Great Expectations gates on {n:,} raw lines: {gate_s:.1f} s, success={gates.success}", flush=True
                )
            for done in root.iterdir():  # Spark's outputs are not needed any more: only the raw logs stay
                if done.name != "raw":
                    shutil.rmtree(done, ignore_errors=True) if done.is_dir() else done.unlink()
            with PeakMemory() as duck_mem:
                t = time.perf_counter()
                d = duckdb_prep(root / "raw", root / "duckdb", args.workers)
                duck_s = time.perf_counter() - t
            print(f"{n:,} duckdb: {duck_s:.1f} s, peak {_mib(duck_mem.peak_python):,} MiB", flush=True)
            agree = (d["input"], d["clean"], d["held"], d["quarantined"], d["duplicates"]) == (
                r.input_records,
                r.clean,
                r.held,
                r.quarantined,
                r.duplicates,
            )
            if not agree:
                raise SystemExit(f"error: the engines disagree at {n:,} records: duckdb {d}, spark {r}")
            run = {
                "records": n,
                "raw_mib": _mib(raw_bytes),
                "generate_s": round(gen_s, 2),
                "spark_s": round(spark_s, 2),
                "duckdb_s": round(duck_s, 2),
                "spark_records_per_s": round(n / spark_s),
                "duckdb_records_per_s": round(n / duck_s),
                "ratio_spark_over_duckdb": round(duck_s / spark_s, 3),
                # Spark: its JVM plus every Python process (the bench and the UDF workers), while Spark ran.
                "spark_peak_rss_mib": _mib(spark_mem.peak_all),
                "spark_peak_jvm_rss_mib": _mib(spark_mem.peak_jvm),
                # DuckDB: the bench and its prepare_line workers while DuckDB ran (the idle JVM left out).
                "duckdb_peak_rss_mib": _mib(duck_mem.peak_python),
                "clean": r.clean,
                "held": r.held,
                "quarantined": r.quarantined,
                "duplicates": r.duplicates,
            }
            report["runs"].append(run)
            print(f"{'':>10} spark/duckdb throughput ratio: {run['ratio_spark_over_duckdb']:.2f}x", flush=True)
            if gates is not None:
                report["runs"].append({"ge_rows": n, "ge_seconds": round(gate_s, 2), "ge_success": gates.success})
            write()
            shutil.rmtree(root, ignore_errors=True)
        sized = [r for r in report["runs"] if "records" in r]
        if len(sized) >= 2:
            a, b = sized[0], sized[-1]
            report["growth"] = {
                "from": a["records"],
                "to": b["records"],
                "records_ratio": round(b["records"] / a["records"], 2),
                "spark_time_ratio": round(b["spark_s"] / a["spark_s"], 2),
                "duckdb_time_ratio": round(b["duckdb_s"] / a["duckdb_s"], 2),
            }
        write()
        if args.json:
            print(f"wrote {args.json}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
