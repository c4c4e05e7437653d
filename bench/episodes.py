"""The episode benchmark: base zero-shot, base few-shot and a tuned champion on whole tau-bench retail
conversations against the live environment, on tasks never trained on.

The split: the 20 dev tasks plus the train tasks `bench/real_data.held_out` holds out (by instruction, share
0.2) are evaluated; the other train tasks train the champion (`flywheel logs import-retail` with db.json: each
task's gold replay, every step a target, then the whole `commerce_flywheel` DAG) and a seeded sample of them
is the base few-shot pool (never evaluated). Then `flywheel eval --episodes`, as a user would run it:

  1. the champion: teacher-forced steps, greedy closed loop (pass^1) and k sampled tries (pass^k);
  2. the base prompts: greedy closed loop (pass^1), and teacher-forced and tries where `--base-full` is given
     (their prompts carry every tool's schema, so each of their steps costs many times the champion's;
     the results file records the prompt tokens and seconds per episode).

Each run has its own time budget (`episodes.time_budget_s`): a run it cuts records what finished and says so.
The paired comparisons (per task, 95 %) of the champion against each base prompt are computed on the tasks both
finished (`evaluate.episode_run.compare_conditions`). Writes bench/results/episodes_retail.json; each run's
HTML report stays under the work folder.

Usage: .venv/bin/python bench/episodes.py [--work /tmp/flywheel-episodes] [--data ../shared/data]
       [--tuned-budget-s 900] [--base-budget-s 600] [--base-full] [--reuse]
--reuse evaluates the champion an earlier run of this script trained (its root under --work) again.
Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from real_data import DAY, commit, flywheel, held_out  # noqa: E402 (the bench folder's own module)

SHOTS = 40  # training-part tasks whose gold steps are the few-shot pool
SHOT_SEED = 11
DAG_ENV = {  # the DAG trains and registers; the episodes below are the evidence, so its own evaluation is short
    "FLYWHEEL_EVALUATION__EXAMPLES": "24",
    "FLYWHEEL_EVALUATION__BASELINES": "false",
    "FLYWHEEL_PROMOTION__BASELINE": "none",
    "FLYWHEEL_AIRFLOW__RUN_TIMEOUT_S": "5400",
    "FLYWHEEL_TRAIN__SWEEP": str(REPO / "bench" / "sweeps" / "episodes.yaml"),
}


def run(root: Path, *args: str, log: Path, env: dict[str, str] | None = None, timeout_s: float = 6300) -> str:
    """One `flywheel` command on `root` as a user runs it (`real_data.flywheel`); stdout returned."""
    return flywheel(root, *args, log=log, timeout_s=timeout_s, extra=env)


def split(data: Path, work: Path) -> dict[str, Path]:
    """Evaluated (dev + held-out train tasks), training part, and the few-shot pool drawn from the training part."""
    folder = data / "retail_tools"
    train_lines = [x for x in (folder / "tasks_train.jsonl").read_text().splitlines() if x.strip()]
    dev_lines = [x for x in (folder / "tasks_dev.jsonl").read_text().splitlines() if x.strip()]
    held = [x for x in train_lines if held_out(json.loads(x)["instruction"])]
    train = [x for x in train_lines if not held_out(json.loads(x)["instruction"])]
    shots = random.Random(SHOT_SEED).sample(train, SHOTS)
    paths = {"evaluated": work / "episodes-evaluated.jsonl", "train": work / "episodes-train.jsonl",
             "shots": work / "episodes-shots.jsonl"}  # fmt: skip
    for key, lines in (("evaluated", dev_lines + held), ("train", train), ("shots", shots)):
        paths[key].write_text("\n".join(lines) + "\n")
    return paths


def champion(root: Path, files: dict[str, Path], data: Path, log: Path) -> str:
    """Import the training part and run the DAG; the version it registered."""
    tools, db = data / "retail_tools" / "tools_openai_schema.json", data / "retail_tools" / "db.json"
    run(root, "logs", "import-retail", str(tools), str(files["train"]), "--date", DAY, "--db", str(db), log=log)
    args = ("run", "--end-date", DAY, "--window-days", "1", "--source", "landed", "--no-deploy")
    run(root, *args, log=log, env=DAG_ENV)
    return registered(root, log)


def registered(root: Path, log: Path) -> str:
    """The champion's version (what `--version champion` evaluates); one clear line when there is none."""
    listed = run(root, "registry", "list", "--json", log=log)
    versions = json.loads(listed[listed.index("{") :])["versions"] if "{" in listed else []
    champion = [v for v in versions if "champion" in (v.get("aliases") or [])]
    if not champion:
        raise SystemExit(f"error: no champion version ({len(versions)} registered); see {log}")
    return str(champion[0]["version"])


def episodes(
    root: Path, files: dict[str, Path], data: Path, log: Path, name: str, budget: float, *options: str
) -> dict:
    tools, db = data / "retail_tools" / "tools_openai_schema.json", data / "retail_tools" / "db.json"
    args = ("eval", "--episodes", str(files["evaluated"]), "--db", str(db), "--tools", str(tools), "--name", name)
    env = {"FLYWHEEL_EPISODES__TIME_BUDGET_S": str(int(budget))}
    out = run(root, *args, *options, "--json", log=log, env=env, timeout_s=budget + 1800)
    return json.JSONDecoder().raw_decode(out[out.index("{") :])[0]


def merged(tuned: dict, base: dict, k: int) -> dict[str, Any]:
    """Both runs' conditions, and the champion paired with each base prompt on the tasks both finished."""
    from pipelines.evaluate.episode_run import compare_conditions

    conditions = {**base["conditions"], **tuned["conditions"]}
    refs = [r for r in ("base_few_shot", "base_zero_shot") if r in conditions]
    comparisons = [compare_conditions(conditions, "tuned_champion", r, k) for r in refs]
    return {"conditions": conditions, "comparisons": comparisons}


def summary(report: dict) -> dict[str, Any]:
    keep = ("name", "tasks", "scored", "gold_changes_state", "cut_by_time_budget", "seconds", "html_uri")
    return {**{k: report.get(k) for k in keep}, "skipped": len(report.get("skipped") or [])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/flywheel-episodes"))
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "episodes_retail.json")
    parser.add_argument("--tuned-budget-s", type=float, default=900.0)
    parser.add_argument("--base-budget-s", type=float, default=600.0)
    parser.add_argument("--base-full", action="store_true", help="the base prompts teacher-forced and with tries too")
    parser.add_argument("--reuse", action="store_true", help="evaluate the champion an earlier run trained")
    args = parser.parse_args()
    if not (args.data / "retail_tools" / "db.json").is_file():
        print(f"error: no retail_tools/db.json under {args.data}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    measured = commit()  # the code the run starts with (a commit made while it runs is not what it measured)
    root, log = args.work / "root", args.work / "run.log"
    args.work.mkdir(parents=True, exist_ok=True)
    files = split(args.data, args.work)
    if args.reuse:
        if not root.is_dir():
            print(f"error: --reuse: no earlier root under {args.work}", file=sys.stderr)
            return 2
        version = registered(root, log)
    else:
        if root.exists():
            import shutil

            shutil.rmtree(root)
        log.write_text("")
        print("training the champion on the training part (import, then the whole DAG) ...", flush=True)
        version = champion(root, files, args.data, log)
    trained_s = round(time.perf_counter() - started)
    print(f"episodes of v{version} (the champion) ...", flush=True)
    tuned = episodes(root, files, args.data, log, "bench-tuned", args.tuned_budget_s, "--version", "champion",
                     "--no-baselines")  # fmt: skip
    print("episodes of the base prompts ...", flush=True)
    base_options = () if args.base_full else ("--no-tries", "--no-teacher-forced")
    base = episodes(root, files, args.data, log, "bench-base", args.base_budget_s, "--shot-tasks",
                    str(files["shots"]), *base_options)  # fmt: skip
    k = int(tuned["settings"]["k"])
    result = {
        "benchmark": "episodes",
        "what": "tau-bench retail episodes against the live environment: closed-loop success (pass^1 greedy, "
        f"pass^{k} from {k} sampled tries), teacher-forced steps, wrong writes, prompt tokens and seconds per "
        "episode, on tasks never trained on",
        "commit": measured,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "version": version,
        "split": {
            "evaluated": "tasks_dev (all) + tasks_train held out by bench/real_data.held_out (sha256 of the "
            "instruction, share 0.2)",
            "evaluated_tasks": sum(1 for _ in files["evaluated"].open()),
            "train_tasks": sum(1 for _ in files["train"].open()),
            "shot_tasks": SHOTS,
        },
        "seeds": {"shot_sample": SHOT_SEED, "tries": "seed = batch start * 1000 + step (closed_loop)"},
        "settings": {
            "dag_env": DAG_ENV,
            "tuned_budget_s": args.tuned_budget_s,
            "base_budget_s": args.base_budget_s,
            "base_full": args.base_full,
            "episodes": tuned["settings"],
            "day": DAY,
        },
        "runs": {"tuned": summary(tuned), "base": summary(base)},
        **merged(tuned, base, k),
        "seconds": {"train": trained_s if not args.reuse else None, "all": round(time.perf_counter() - started)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(partial, args.out)
    for name, row in result["conditions"].items():
        print(name, {m: row.get(m) for m in ("tasks", "closed_loop_pass^1", f"closed_loop_pass^{k}",
                                             "teacher_forced_step_exact", "wrong_writes")})  # fmt: skip
    print(f"wrote {args.out}")
    return 0


def machine() -> str:
    from pipelines.hardware import cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores"


if __name__ == "__main__":
    sys.exit(main())
