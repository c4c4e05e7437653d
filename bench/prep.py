"""Prep throughput: Spark (local[*]) vs the same transformation in DuckDB, side by side, with peak memory.

Both engines run the same per-record function (`prepare_line`: validate, quarantine reason, PII redaction, SFT
fields, with Spark's tool catalogue, late ratings and label policy) and the same set logic (dedupe by normalized
request + tool call, a training row kept before a held one, then the earliest; session splits stratified by
tool), on the same cores, and write the same three tables with Spark's columns (examples by split and day, clean
logs, quarantine with the duplicates' reason). Spark: `run_prep` itself (local[*] threads; it also counts the
raw lines, digests the outputs, writes the manifest and swaps the window in, and writes a fourth table, the rated
turns KTO learns from, which DuckDB does not: the results recorded before it were measured without it). DuckDB:
one worker process per core runs `prepare_line` over byte ranges of the raw files, streamed to Parquet in
batches (bounded memory at any size), then DuckDB's own threads run the set logic on a database file under
`--duckdb-memory-limit`.

Checked after each size (outside the timings): the counts agree, and the kept record ids are the same rows in
both. The splits follow the same rule with each engine's own hash (Spark's xxhash64, DuckDB's hash), so their
sizes agree and their members differ. Peak memory: the proportional set size (PSS: shared pages counted once) of
the process tree, sampled while each engine runs: Spark's JVM and its Python workers for Spark, the bench and its
workers for DuckDB (the idle JVM's subtree left out). Also times the Great Expectations gates on one size's window.

Usage: .venv/bin/python bench/prep.py [--sizes 100000 1000000] [--gates-size N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
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
from typing import Any

import duckdb
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.config import Settings, load_settings
from pipelines.errors import one_line
from pipelines.logs.feedback import read_feedback
from pipelines.logs.toolsets import registered_catalogue
from pipelines.prep.nodes import (
    CLEAN_LOG_COLUMNS,
    EXAMPLE_COLUMNS,
    PREPARED_COLUMNS,
    PREPARED_SCHEMA,
    QUARANTINE_COLUMNS,
    prepare_line,
)
from pipelines.prep.pipeline import raw_files_for, run_prep, zone_paths
from pipelines.quality.gates import run_gates
from pipelines.simulate.generator import GeneratorConfig, write_raw_logs
from pipelines.window import DateWindow

END = date(2026, 11, 20)
DAYS = 7
SEED = 1
BATCH = 50_000
SPARK_DRIVER_MEMORY = "2g"  # pipelines.clients.spark.get_spark's local driver
ARROW_TYPES = {"string": pa.string(), "double": pa.float64(), "int": pa.int32(), "array<string>": pa.list_(pa.string())}
ARROW_SCHEMA = pa.schema([(c.split(" ")[0], ARROW_TYPES[c.split(" ", 1)[1]]) for c in PREPARED_SCHEMA.split(", ")])


class PeakMemory:
    """The largest proportional set size (PSS) of this process tree seen while a block runs, split into the
    JVM's subtree (Spark's JVM and the Python workers it forks) and the rest (the bench and its workers).

    A sampler, not a synchronisation: it reads psutil every `interval` seconds and stops when told.
    """

    def __init__(self, interval: float = 0.5) -> None:
        self.interval = interval
        self.peak_jvm = 0
        self.peak_python = 0
        self.peak_all = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _pss(p: psutil.Process) -> int:
        try:
            return int(getattr(p.memory_full_info(), "pss", 0) or p.memory_info().rss)
        except psutil.Error:
            return 0

    def _sample(self) -> None:
        me = psutil.Process()
        tree = me.children(recursive=True)
        jvm_tree: set[int] = set()
        for p in tree:
            try:
                if p.name() == "java":
                    jvm_tree |= {p.pid, *(c.pid for c in p.children(recursive=True))}
            except psutil.Error:
                continue
        jvm = sum(self._pss(p) for p in tree if p.pid in jvm_tree)
        python = self._pss(me) + sum(self._pss(p) for p in tree if p.pid not in jvm_tree)
        self.peak_jvm = max(self.peak_jvm, jvm)
        self.peak_python = max(self.peak_python, python)
        self.peak_all = max(self.peak_all, jvm + python)

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


def byte_ranges(files: list[str], parts: int) -> list[tuple[str, int, int]]:
    """The raw files cut into about `parts` x (files) byte ranges of similar size; a range owns the lines that
    start inside it (gzip files are not cut: one range each)."""
    sizes = {f: os.path.getsize(f) for f in files}
    target = max(1, sum(sizes.values()) // max(1, parts * 4))
    out = []
    for f in files:
        if f.endswith(".gz") or sizes[f] <= target:
            out.append((f, 0, sizes[f]))
            continue
        starts = list(range(0, sizes[f], target))
        out += [(f, a, min(a + target, sizes[f])) for a in starts]
    return out


def _lines_in(path: str, start: int, end: int):  # noqa: ANN202 (an iterator of raw lines)
    """The non-blank lines of `path` that start in [start, end)."""
    if path.endswith(".gz"):
        from pipelines.logs.raw import iter_lines

        yield from iter_lines(Path(path))
        return
    with open(path, "rb") as fh:
        if start:
            fh.seek(start - 1)
            fh.readline()  # the line running into `start` belongs to the range before
        while fh.tell() < end:
            line = fh.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield line


def _prepare_range(task: tuple[str, int, int, str, dict[str, Any]]) -> int:
    """One worker's share: `prepare_line` over one byte range, written to Parquet in batches of BATCH rows."""
    path, start, end, out, context = task
    rows: dict[str, list] = {c: [] for c in PREPARED_COLUMNS}
    n = 0
    with pq.ParquetWriter(out, ARROW_SCHEMA) as writer:
        for line in _lines_in(path, start, end):
            for c, v in prepare_line(line, path, **context).items():
                rows[c].append(v)
            n += 1
            if len(rows["status"]) >= BATCH:
                writer.write_table(pa.table(rows, schema=ARROW_SCHEMA))
                rows = {c: [] for c in PREPARED_COLUMNS}
        if rows["status"]:
            writer.write_table(pa.table(rows, schema=ARROW_SCHEMA))
    return n


def _cols(columns: list[str], prefix: str = "") -> str:
    return ", ".join(f"{prefix}{c}" for c in columns)


def duckdb_prep(
    settings: Settings, window: DateWindow, out: Path, workers: int, memory_limit: str, timeout_s: float
) -> dict[str, int]:
    raw = settings.zone("raw")
    context = {
        "tools": registered_catalogue(raw),
        "feedback": read_feedback(raw),
        "trained": tuple(settings.quality.train_label_sources),
    }
    staged = out / "prepared"
    staged.mkdir(parents=True, exist_ok=True)
    ranges = byte_ranges([f.removeprefix("file://") for f in raw_files_for(settings, window)], workers)
    tasks = [(f, a, b, str(staged / f"part-{i:05d}.parquet"), context) for i, (f, a, b) in enumerate(ranges)]
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_prepare_range, tasks, timeout=timeout_s))
    con = duckdb.connect(str(out / "prep.duckdb"))  # a file: tables larger than memory live on disk
    con.execute(f"SET threads TO {workers}")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute("SET preserve_insertion_order = false")
    con.execute(f"SET temp_directory = '{out / 'spill'}'")
    con.execute(
        "CREATE VIEW prepared AS SELECT *, try_cast(event_time AS TIMESTAMP) AS ts, "
        f"regexp_extract(source_file, 'dt=([0-9-]{{10}})', 1) AS dt FROM read_parquet('{staged}/*.parquet')"
    )
    # nodes.mark_duplicates: a record that trains before a held one, then the earliest; the first kept one named
    con.execute("""
        CREATE TABLE marked AS SELECT *,
          row_number() OVER w AS rn, first_value(record_id) OVER w AS first_id
        FROM prepared WHERE status = 'clean'
        WINDOW w AS (PARTITION BY dedupe_key ORDER BY held IS NOT NULL, ts, record_id, source_file)""")
    con.execute("""
        CREATE TABLE sessions AS SELECT session_id, tool AS stratum FROM (
          SELECT session_id, tool, row_number() OVER (PARTITION BY session_id ORDER BY turn_index, ts) AS n
          FROM marked WHERE rn = 1 AND held IS NULL) WHERE n = 1""")
    con.execute("""
        CREATE TABLE splits AS SELECT session_id, CASE WHEN p >= 0.9 THEN 'test' WHEN p >= 0.8 THEN 'val'
          ELSE 'train' END AS split FROM (SELECT session_id, percent_rank() OVER (
          PARTITION BY stratum ORDER BY hash(session_id), session_id) AS p FROM sessions)""")
    example_cols = [c for c in EXAMPLE_COLUMNS if c not in ("split", "dt", "event_timestamp")]
    con.execute(f"""COPY (SELECT {_cols(example_cols, "m.")}, m.ts AS event_timestamp, s.split, m.dt
                          FROM marked m JOIN splits s USING (session_id) WHERE rn = 1 AND held IS NULL)
                    TO '{out / "examples"}' (FORMAT parquet, PARTITION_BY (split, dt), OVERWRITE_OR_IGNORE)""")
    log_cols = [c for c in CLEAN_LOG_COLUMNS if c not in ("dt", "event_timestamp")]
    con.execute(f"""COPY (SELECT {_cols(log_cols)}, ts AS event_timestamp, dt FROM marked WHERE rn = 1)
                    TO '{out / "clean_logs"}' (FORMAT parquet, PARTITION_BY (dt), OVERWRITE_OR_IGNORE)""")
    q_cols = [c for c in QUARANTINE_COLUMNS if c not in ("reason", "detail", "raw_redacted", "dt")]
    con.execute(f"""COPY (
          SELECT reason, detail, {_cols(q_cols)}, raw_redacted, dt FROM prepared WHERE status = 'quarantined'
          UNION ALL
          SELECT 'duplicate', 'duplicate of ' || first_id, {_cols(q_cols)}, NULL, dt FROM marked WHERE rn > 1)
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


def same_kept_rows(spark_logs: str, duckdb_logs: Path) -> bool:
    """The two engines kept the same records: their clean logs hold the same record ids (outside the timings)."""
    con = duckdb.connect()
    a = f"read_parquet('{spark_logs.removeprefix('file://')}/**/*.parquet')"
    b = f"read_parquet('{duckdb_logs}/**/*.parquet')"
    differ = con.execute(
        f"SELECT count(*) FROM ((SELECT record_id FROM {a} EXCEPT SELECT record_id FROM {b}) "
        f"UNION ALL (SELECT record_id FROM {b} EXCEPT SELECT record_id FROM {a}))"
    ).fetchone()
    con.close()
    return differ is not None and differ[0] == 0


def _mib(n: int) -> int:
    return round(n / 2**20)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False, timeout=60).stdout.strip()


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--gates-size", type=int, help="the size whose window the GE gates check (default: largest)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="DuckDB's prepare_line processes")
    parser.add_argument("--duckdb-memory-limit", default="8GB", help="DuckDB's memory_limit (it spills past it)")
    parser.add_argument("--stage-timeout", type=float, default=4 * 3600, help="seconds for DuckDB's workers")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.gates_size is not None and args.gates_size not in args.sizes:
        parser.error(f"--gates-size {args.gates_size} is not one of --sizes {args.sizes}: the gates would never run")
    return args


def main() -> None:
    args = _args()
    gates_size = args.gates_size or max(args.sizes)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pipelines.clients.spark import get_spark
    from pipelines.hardware import cpu_model

    work = Path(tempfile.mkdtemp(prefix="bench-prep-"))
    base_settings = load_settings(root=str(work / "spark"))
    report: dict = {
        "benchmark": "prep",
        "what": "prep on Spark (local[*], run_prep itself) against the same per-record function, set logic and "
        f"tables on DuckDB ({args.workers} prepare_line processes over byte ranges, then DuckDB's threads on a "
        "database file), by record count, with each engine's peak memory (PSS)",
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
            "duckdb_memory_limit": args.duckdb_memory_limit,
            "spark": base_settings.spark.model_dump(mode="json"),
            "spark_driver_memory": SPARK_DRIVER_MEMORY,
            "splits": "the same rule, each engine's own hash: sizes compared, members not",
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
        print(f"Spark session start: {report['spark_start_s']} s (not counted below); cores: {os.cpu_count()}")
        window = DateWindow.ending(END, DAYS)
        for n in args.sizes:
            run = _one_size(n, work / f"n{n}", window, spark, args, gates_size)
            report["runs"].extend(run)
            write()
        sized = [r for r in report["runs"] if "spark_s" in r]
        if len(sized) >= 2:
            a, b = sized[0], sized[-1]
            report["growth"] = {
                "from": a["records"],
                "to": b["records"],
                "records_ratio": round(b["records"] / a["records"], 2),
                "spark_time_ratio": round(b["spark_s"] / a["spark_s"], 2),
                "duckdb_time_ratio": round(b["duckdb_s"] / a["duckdb_s"], 2),
            }
        report["commit"]["dirty_at_end"] = bool(_git("status", "--porcelain"))
        write()
        if args.json:
            print(f"wrote {args.json}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _one_size(
    n: int, root: Path, window: DateWindow, spark: Any, args: argparse.Namespace, gates_size: int
) -> list[dict[str, Any]]:
    """Generate `n` records, run both engines on them, check they agree; the size's rows of the results."""
    free = shutil.disk_usage(root.parent).free
    t = time.perf_counter()
    write_raw_logs(GeneratorConfig(seed=SEED, records=n, days=DAYS, end_date=END), root / "raw")
    gen_s = time.perf_counter() - t
    settings = load_settings(root=str(root))
    raw_bytes = sum(os.path.getsize(f.removeprefix("file://")) for f in raw_files_for(settings, window))
    if free < 4 * raw_bytes:  # raw + Spark's staging and tables, then DuckDB's staging, database and tables
        raise SystemExit(f"error: {n:,} records need about {4 * raw_bytes / 2**30:.0f} GiB free; {free / 2**30:.0f}")
    print(f"{n:,} records generated in {gen_s:.0f} s ({raw_bytes / 2**20:,.0f} MiB raw)", flush=True)
    spark_error = None
    with PeakMemory() as spark_mem:
        t = time.perf_counter()
        try:
            r = run_prep(settings, window, spark=spark)
        except Exception as exc:  # noqa: BLE001 (a failure at a size is a result: recorded, DuckDB still timed)
            spark_error = one_line(exc)[:500]
        spark_s = time.perf_counter() - t
    print(f"{n:,} spark: {spark_s:.1f} s, peak {_mib(spark_mem.peak_all):,} MiB {spark_error or ''}", flush=True)
    if spark_error is not None:
        return [_spark_failed(n, root, raw_bytes, gen_s, spark_s, spark_error, spark_mem, settings, window, args)]
    rows: list[dict[str, Any]] = []
    if n == gates_size:
        t = time.perf_counter()
        gates = run_gates(settings, window, spark=spark, raise_on_failure=False)
        gate_s = time.perf_counter() - t
        print(f"Great Expectations gates on {n:,} raw lines: {gate_s:.1f} s, success={gates.success}", flush=True)
        rows.append({"ge_rows": n, "ge_seconds": round(gate_s, 2), "ge_success": gates.success})
    spark_logs = zone_paths(settings)["clean_logs"]
    keep = {root / "raw", root / "curated", Path(spark_logs.removeprefix("file://"))}
    for done in [*root.iterdir(), *(root / "curated").iterdir()]:  # Spark's outputs but its clean logs: disk
        if done not in keep and not any(k.is_relative_to(done) for k in keep):
            shutil.rmtree(done, ignore_errors=True) if done.is_dir() else done.unlink()
    with PeakMemory() as duck_mem:
        t = time.perf_counter()
        d = duckdb_prep(settings, window, root / "duckdb", args.workers, args.duckdb_memory_limit, args.stage_timeout)
        duck_s = time.perf_counter() - t
    print(f"{n:,} duckdb: {duck_s:.1f} s, peak {_mib(duck_mem.peak_python):,} MiB", flush=True)
    counts = (r.input_records, r.clean, r.held, r.quarantined, r.duplicates)
    if (d["input"], d["clean"], d["held"], d["quarantined"], d["duplicates"]) != counts:
        raise SystemExit(f"error: the engines disagree at {n:,} records: duckdb {d}, spark {r}")
    if not same_kept_rows(spark_logs, root / "duckdb" / "clean_logs"):
        raise SystemExit(f"error: the engines kept different records at {n:,} records")
    shutil.rmtree(root, ignore_errors=True)
    run = {
        "records": n,
        "raw_mib": _mib(raw_bytes),
        "generate_s": round(gen_s, 2),
        "spark_s": round(spark_s, 2),
        "duckdb_s": round(duck_s, 2),
        "spark_records_per_s": round(n / spark_s),
        "duckdb_records_per_s": round(n / duck_s),
        "ratio_spark_over_duckdb": round(duck_s / spark_s, 3),
        "spark_peak_pss_mib": _mib(spark_mem.peak_all),  # the JVM's subtree and the bench, while Spark ran
        "spark_peak_jvm_pss_mib": _mib(spark_mem.peak_jvm),
        "duckdb_peak_pss_mib": _mib(duck_mem.peak_python),  # the bench and its workers while DuckDB ran
        "same_kept_rows": True,
        "clean": r.clean,
        "held": r.held,
        "quarantined": r.quarantined,
        "duplicates": r.duplicates,
    }
    print(f"{'':>10} spark/duckdb throughput ratio: {run['ratio_spark_over_duckdb']:.2f}x", flush=True)
    return [run, *rows]


def _spark_failed(
    n: int, root: Path, raw_bytes: int, gen_s: float, spark_s: float, error: str, spark_mem: PeakMemory,
    settings: Settings, window: DateWindow, args: argparse.Namespace,
) -> dict[str, Any]:  # fmt: skip
    """A size Spark failed at: its error and seconds, and DuckDB on the same raw logs."""
    for done in [p for p in root.iterdir() if p.name != "raw"]:
        shutil.rmtree(done, ignore_errors=True)
    with PeakMemory() as duck_mem:
        t = time.perf_counter()
        d = duckdb_prep(settings, window, root / "duckdb", args.workers, args.duckdb_memory_limit, args.stage_timeout)
        duck_s = time.perf_counter() - t
    print(f"{n:,} duckdb: {duck_s:.1f} s, peak {_mib(duck_mem.peak_python):,} MiB", flush=True)
    shutil.rmtree(root, ignore_errors=True)
    return {
        "records": n, "raw_mib": _mib(raw_bytes), "generate_s": round(gen_s, 2),
        "spark_error": error, "spark_failed_after_s": round(spark_s, 2),
        "spark_peak_pss_mib": _mib(spark_mem.peak_all), "spark_peak_jvm_pss_mib": _mib(spark_mem.peak_jvm),
        "duckdb_s": round(duck_s, 2), "duckdb_records_per_s": round(n / duck_s),
        "duckdb_peak_pss_mib": _mib(duck_mem.peak_python), "duckdb_counts": d,
    }  # fmt: skip


if __name__ == "__main__":
    main()
