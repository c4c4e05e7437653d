"""`make demo`'s time after the install (issue 52's goal: at most ten minutes on the 2-core machine).

Runs `flywheel demo` as `make demo` does, with its defaults, in a fresh folder (its root `<work>/.flywheel`; no
`FLYWHEEL_*` variable of the caller's shell passed on), and times it as a whole and by DAG task: the progress
records the demo prints, one per task as it ends. The install (`make setup serve-env`) is not timed: run it first.
What a user's first demo pays after it is timed (the base model's one-time conversion to safetensors included).
The demo's own output is printed as it runs and kept in `<work>/demo.log`.

One run (n 1): the per-task seconds say where the time goes; no interval is claimed.

The demo's Triton server and gateway are stopped after it (`flywheel down`). A `--work` folder this script did not
make is refused, never deleted.

Usage: .venv/bin/python bench/demo.py [--work /tmp/flywheel-demo-time] [--out bench/results/demo.json]
       [--timeout-s 4500]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from real_data import commit  # noqa: E402 (the bench folder's own modules)
from slip import hold, machine  # noqa: E402

from pipelines.storage import write_text  # noqa: E402

GOAL_S = 600  # issue 52: `make demo` at most ten minutes after the install on this machine
DEMO_ARGS = {"records_per_day": 1500, "days": 7, "seed": 7}  # `flywheel demo`'s defaults, passed as options
MARKER = ".bench-demo"  # a work folder this script made: the only kind it deletes


def flywheel(work: Path, *args: str) -> subprocess.Popen:
    """`flywheel ARGS` in `work` (its root `work/.flywheel`), without the caller's `FLYWHEEL_*` variables, in its
    own session (so a timeout can stop all of it), its output on a pipe."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.Popen(  # noqa: S603 (our own entry point)
        [str(REPO / ".venv" / "bin" / "flywheel"), *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen, grace_s: float = 120) -> None:
    """SIGTERM to `flywheel` (it stops the `airflow dags test` it started, in that one's own session), then
    SIGKILL to its whole session after `grace_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_demo(work: Path, timeout_s: float) -> tuple[int, float, bool]:
    """`flywheel demo` in `work`, its lines printed and kept in `work/demo.log`; (return code, seconds, timed out)."""
    options = [f"--{k.replace('_', '-')}={v}" for k, v in DEMO_ARGS.items()]
    started = time.perf_counter()
    fired = threading.Event()
    proc = flywheel(work, "demo", *options)
    timer = threading.Timer(timeout_s, lambda: (fired.set(), stop(proc)))  # the demo's own waits have timeouts too
    timer.start()
    try:
        with (work / "demo.log").open("w") as log:
            assert proc.stdout is not None
            for line in proc.stdout:  # ends when its session is gone (a timeout stops all of it)
                log.write(line)
                print(line, end="", flush=True)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:  # its output closed but it did not end: stopped and counted as failed
            stop(proc, grace_s=10)
            code = proc.wait(timeout=30)
    finally:
        timer.cancel()
    return code, time.perf_counter() - started, fired.is_set()


def down(work: Path) -> None:
    """`flywheel down` for a demo's root: the Triton server and gateway it left running (so the next run's ports
    are free and its folder can be removed); bounded."""
    if not (work / ".flywheel").exists():
        return
    proc = flywheel(work, "down")
    try:
        out, _ = proc.communicate(timeout=180)
        print(f"flywheel down: return code {proc.returncode} {out.strip().splitlines()[-1:]}")
    except subprocess.TimeoutExpired:
        stop(proc, grace_s=10)
        print("flywheel down did not finish in 180 s: check for servers left running (`flywheel status`)")


def fresh(work: Path) -> None:
    """An empty work folder: one this script made before is stopped and removed; any other existing folder is
    refused (it is never deleted)."""
    if work.exists():
        if not (work / MARKER).is_file():
            raise SystemExit(f"error: {work} exists and was not made by bench/demo.py; pass another --work")
        down(work)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / MARKER).write_text("made by bench/demo.py; removed by its next run\n")


def task_seconds(root: Path) -> list[dict[str, Any]]:
    """Each DAG task's seconds as the demo's progress records hold them, in the order the tasks ended."""
    records = [json.loads(p.read_text()) for p in (root / "reports" / "runs" / "progress").glob("*/*.json")]
    records.sort(key=lambda r: r.get("at") or "")
    return [{"task": r.get("task"), "seconds": r.get("seconds"), "summary": r.get("summary")} for r in records]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/flywheel-demo-time"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "demo.json")
    parser.add_argument("--timeout-s", type=float, default=4500, help="airflow.run_timeout_s (3600) and a margin")
    args = parser.parse_args()
    stamps = (REPO / ".venv" / ".installed", REPO / ".venv-serve" / ".installed")  # what make touches when done
    if not all(stamp.is_file() for stamp in stamps):
        print("error: run `make setup serve-env` first (the install is not timed)", file=sys.stderr)
        return 2
    measured = commit()  # the code that runs, read before it runs
    lock = hold(args.work)  # noqa: F841 (held until the process ends; taken before anything is removed)
    fresh(args.work)
    try:
        code, seconds, timed_out = run_demo(args.work, args.timeout_s)
    finally:
        down(args.work)
    tasks = task_seconds(args.work / ".flywheel")
    in_tasks = sum(float(t["seconds"] or 0) for t in tasks)
    result = {
        "benchmark": "demo",
        "what": "`flywheel demo` (what `make demo` runs after the install) on its defaults in a fresh folder: its "
        "wall time against issue 52's goal, and each DAG task's seconds",
        "commit": measured,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "argv": sys.argv,
        "settings": {"demo": DEMO_ARGS, "goal_s": GOAL_S, "timeout_s": args.timeout_s},
        "seeds": {"demo traffic": DEMO_ARGS["seed"]},
        "n": 1,
        "returncode": code,
        "timed_out": timed_out,
        "seconds": round(seconds, 1),
        "goal_met": code == 0 and seconds <= GOAL_S,
        "tasks": tasks,
        "seconds_in_tasks": round(in_tasks, 1),
        # the rest: starting `flywheel` and `airflow dags test`, parsing the DAG, the short-circuit and branch tasks
        # (no progress record), Airflow's start of each task, and the demo's own steps after the DAG
        "seconds_outside_tasks": round(seconds - in_tasks, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(args.out), json.dumps(result, indent=1) + "\n")  # atomically
    verdict = "met" if result["goal_met"] else "not met"
    ran = "timed out" if timed_out else f"return code {code}"
    print(f"flywheel demo: {seconds:.0f} s ({ran}); the {GOAL_S} s goal {verdict}; wrote {args.out}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
