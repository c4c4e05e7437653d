"""Tuning after SFT on real data (issue 51's acceptance): tau-bench retail, SFT against SFT + GRPO and SFT + DPO on
the disagreements of an offline shadow run against the gold, on requests never trained on (KTO needs thumbs, and
tau-bench has none: left out, and said so in the results).

The split is the episode benchmark's (`bench/episodes.py`): the 20 dev tasks plus the train tasks
`bench/real_data.held_out` holds out (by instruction) are evaluated; the other train tasks train. Each task is its
gold replay against tau-bench's database (`flywheel logs import-retail`: every step a request with the real
results before it). Then, as a user runs it:

  1. `flywheel run --source landed --no-deploy`: prep, gates, features, the SFT sweep, registry (tune off);
  2. `flywheel tune grpo --version N`: GRPO on the SFT adapter, sampled as served, rewarded by the scorer;
  3. `flywheel eval --split train --version N`: the offline shadow run, whose wrong answers become preference pairs
     (the gold over the model's answer: `flywheel labels pairs`, source `evaluation`), then `flywheel tune dpo`;
  4. `flywheel eval --logs <held-out steps> --version N --adapter grpo=... --adapter dpo=...`: all on the same
     requests, decoded as served; the report pairs each tuned adapter against the SFT version (exact match,
     argument F1, tool name; 95 % intervals, McNemar) and counts each side's wrong writes.

Writes bench/results/tune_retail.json (commit, settings, seeds, n) and keeps the evaluation's HTML report under
the work folder. Not part of `make test` (the results file records how long it ran).

Usage: .venv/bin/python bench/tune_retail.py [--work /tmp/flywheel-tune-retail] [--data ../shared/data]
       [--examples 120] [--shadow 300] [--resume] [--until dpo]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from episodes import split  # noqa: E402 (the bench folder's own modules)
from real_data import DAY, commit, flywheel  # noqa: E402
from slip import as_json, hold, load_state, machine, save_state  # noqa: E402

DAG_ENV = {  # the DAG trains and registers the SFT version; the held-out evaluation below is the evidence
    "FLYWHEEL_EVALUATION__EXAMPLES": "24",
    "FLYWHEEL_EVALUATION__BASELINES": "false",
    "FLYWHEEL_PROMOTION__BASELINE": "none",
    "FLYWHEEL_AIRFLOW__RUN_TIMEOUT_S": "5400",
    "FLYWHEEL_TRAIN__SWEEP": str(REPO / "bench" / "sweeps" / "episodes.yaml"),
}
# GRPO's settings for this run, chosen before it ran (recorded in the results): the slip benchmark's learning
# rate, fewer steps (retail's answers are long: each step samples two groups of four under the grammar).
GRPO_ENV = {"FLYWHEEL_TUNE__GRPO__LEARNING_RATE": "5e-5", "FLYWHEEL_TUNE__GRPO__MAX_STEPS": "15"}
DPO_ENV = {"FLYWHEEL_TUNE__DPO__LEARNING_RATE": "2e-4", "FLYWHEEL_TUNE__DPO__MAX_STEPS": "60"}  # the slip bench's
METRICS = ("exact_match", "name_accuracy", "arg_f1", "json_valid", "wrong_writes")


def run(root: Path, *args: str, log: Path, env: dict[str, str] | None = None, timeout_s: float = 6300) -> str:
    """One `flywheel` command on `root` as a user runs it (`real_data.flywheel`); stdout returned."""
    return flywheel(root, *args, log=log, timeout_s=timeout_s, extra=env)


def heldout_steps(root: Path, files: dict[str, Path], data: Path, work: Path, log: Path) -> Path:
    """The evaluated tasks' gold replays as one log file of requests (every step, with the real results)."""
    tools = data / "retail_tools" / "tools_openai_schema.json"
    held = work / "heldout-raw"
    if held.exists():
        shutil.rmtree(held)
    run(root, "logs", "import-retail", str(tools), str(files["evaluated"]), "--date", DAY, "--out", str(held), log=log)
    merged = work / "heldout.jsonl"
    merged.write_bytes(b"".join(p.read_bytes() for p in sorted(held.rglob("*.jsonl"))))
    return merged


def step_commit(saved: dict[str, Any], step: str) -> None:
    """The code a step ran with (a `--resume`d run can span commits); the steps before this was recorded ran at
    the run's first commit (`commit`)."""
    saved.setdefault("commits", {})[step] = commit()


def stopped(step: str, state: Path) -> int:
    """`--until STEP`: the steps up to STEP are saved in `state`; `--resume` goes on from there."""
    print(f"stopped after {step} (--until): the state is in {state}; --resume goes on", flush=True)
    return 0


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """Each condition's figures and the paired comparisons the evaluation computed."""
    rows = {
        c["condition"]: {**{k: c["summary"].get(k) for k in METRICS},
                         "prompt_tokens": c["stats"].get("prompt_tokens_mean")}
        for c in report["conditions"]
    }  # fmt: skip
    comparisons = []
    for c in report.get("comparisons") or []:
        if c["reference"].startswith("base_"):
            continue
        metrics = {m: c["metrics"][m] for m in ("task", "exact_match", "name_accuracy", "arg_f1") if m in c["metrics"]}
        comparisons.append({"condition": c["condition"], "reference": c["reference"], "n": c.get("n"),
                            "wrong_writes": c.get("wrong_writes"), "metrics": metrics})  # fmt: skip
    return {"rows": rows, "comparisons": comparisons}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/flywheel-tune-retail"))
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tune_retail.json")
    parser.add_argument("--examples", type=int, default=120, help="held-out requests (a seeded sample by tool)")
    parser.add_argument("--shadow", type=int, default=300, help="training requests of the offline shadow run")
    parser.add_argument("--resume", action="store_true", help="go on from the last step an earlier run finished")
    parser.add_argument("--until", choices=("sft", "grpo", "pairs", "dpo"), help="stop once this step is saved")
    args = parser.parse_args()
    if not (args.data / "retail_tools" / "db.json").is_file():
        print(f"error: no retail_tools/db.json under {args.data}", file=sys.stderr)
        return 2
    lock = hold(args.work)  # noqa: F841 (held until the process ends)
    started = time.perf_counter()
    work, log = args.work, args.work / "run.log"
    root, state = work / "root", work / "state.json"
    if not args.resume:
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        log.write_text("")
        save_state(state, {"commit": commit()})
    saved = load_state(state, ("commit",))
    files = split(args.data, work)
    tools = args.data / "retail_tools" / "tools_openai_schema.json"
    if "version" not in saved:
        print("sft: import the training tasks' gold replays, then the DAG ...", flush=True)
        run(root, "logs", "import-retail", str(tools), str(files["train"]), "--date", DAY, log=log)
        run(root, "run", "--end-date", DAY, "--window-days", "1", "--source", "landed", "--no-deploy", log=log,
            env=DAG_ENV)  # fmt: skip
        versions = as_json(run(root, "registry", "list", "--json", log=log))["versions"]
        if not versions:
            raise SystemExit(f"error: the DAG registered no version under {root}; see {log}")
        saved["version"] = str(max(int(v["version"]) for v in versions))
        step_commit(saved, "sft")
        save_state(state, saved)
    if args.until == "sft":
        return stopped(args.until, state)
    if "grpo" not in saved:
        print(f"grpo: flywheel tune grpo --version {saved['version']} ...", flush=True)
        saved["grpo"] = as_json(run(root, "tune", "grpo", "--version", saved["version"], "--json", log=log,
                                    env=GRPO_ENV))  # fmt: skip
        step_commit(saved, "grpo")
        save_state(state, saved)
    if args.until == "grpo":
        return stopped(args.until, state)
    if "pairs" not in saved:  # its own step: the shadow run is the longest of the bench's steps on a CPU
        print(f"dpo: an offline shadow run of v{saved['version']} on {args.shadow} training requests ...", flush=True)
        run(root, "eval", "--split", "train", "--version", saved["version"], "--examples", str(args.shadow),
            "--no-baselines", "--name", "shadow", log=log, timeout_s=10800)  # fmt: skip
        saved["pairs"] = as_json(run(root, "labels", "pairs", "--json", log=log))
        step_commit(saved, "pairs")
        save_state(state, saved)
    if args.until == "pairs":
        return stopped(args.until, state)
    if "dpo" not in saved:
        saved["dpo"] = as_json(run(root, "tune", "dpo", "--version", saved["version"], "--json", log=log,
                                   env=DPO_ENV, timeout_s=10800))  # fmt: skip
        step_commit(saved, "dpo")
        save_state(state, saved)
    if args.until:  # each step before is saved: --resume goes on from here
        return stopped(args.until, state)
    adapters = []
    for method in ("grpo", "dpo"):
        if saved[method].get("skipped") or not saved[method].get("adapter_dir"):
            print(f"{method}: trained nothing: {saved[method].get('skipped')}", flush=True)
            continue
        adapters += ["--adapter", f"{method}={saved[method]['adapter_dir']}"]
    heldout = heldout_steps(root, files, args.data, work, log)
    print(f"evaluating v{saved['version']} and the tuned adapters on {args.examples} held-out requests ...", flush=True)
    out = run(root, "eval", "--logs", str(heldout), "--examples", str(args.examples), "--no-baselines",
              "--version", saved["version"], *adapters, "--name", "tune-retail", "--json", log=log,
              timeout_s=10800)  # fmt: skip
    report = as_json(out)
    result = {
        "benchmark": "tune_retail",
        "what": "tau-bench retail: the SFT version against the same adapter tuned by GRPO and by DPO (an offline "
        "shadow run's disagreements with the gold), on requests of tasks never trained on, decoded as served; "
        "paired per request",
        "commit": commit(),  # the evaluation's; each step's own below
        "commits_by_step": {"first": saved["commit"], **saved.get("commits", {})},
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "argv": sys.argv,
        "settings": {
            "dag_env": DAG_ENV,
            "grpo_env": GRPO_ENV,
            "examples": args.examples,
            "day": DAY,
            "evaluation": report.get("settings"),
            "dpo_env": DPO_ENV,
            "shadow_requests": args.shadow,
            "not_run": {"kto": "tau-bench tasks carry no ratings: no thumbs to learn from"},
        },  # fmt: skip
        "seeds": {
            "split": "sha256 of the instruction (real_data.held_out, share 0.2)",
            "sweep": 0,
            "grpo": "tune.grpo.seed (0)",
            "evaluation_sample": report.get("settings", {}).get("seed"),
            "bootstrap": 0,
        },  # fmt: skip
        "version": saved["version"],
        "split": {
            "evaluated_tasks": sum(1 for _ in files["evaluated"].open()),
            "train_tasks": sum(1 for _ in files["train"].open()),
            "requests": report.get("examples"),
        },  # fmt: skip
        "pairs": {k: saved["pairs"].get(k) for k in ("pairs", "by_source", "dropped", "quarantined")},
        "cost": {
            m: {k: saved[m].get(k) for k in ("seconds", "tokens", "steps", "prompts", "pairs", "too_long", "skipped")}
            for m in ("grpo", "dpo")
        },
        "evaluation": {"report": report.get("html_uri"), "seconds": report.get("seconds")},
        **summary(report),
        "seconds": round(time.perf_counter() - started),
    }
    from pipelines.storage import write_text

    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(args.out), json.dumps(result, indent=1) + "\n")  # atomic: a reader never sees half a file
    for name, row in result["rows"].items():
        print(name, row)
    for c in result["comparisons"]:
        print(c["condition"], "-", c["reference"], {m: (v.get("diff"), v.get("low"), v.get("high"))
                                                    for m, v in c["metrics"].items()})  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
