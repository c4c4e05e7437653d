"""The injected slip (issue 51's acceptance): does tuning from outcomes fix a mistake the teacher makes, without
costing any other tool?

Generated traffic, so the truth is known (`pipelines.simulate.generator.Slip`): the teacher logs
`track_shipment` instead of `get_order` in 30 % of the get_order turns (those asked in the slip's own phrasings,
"where's my order ORD-..."); people rate 20 % of those slipped answers down and 20 % of the right answers up; a
reviewer corrects a share of the down-rated ones (`flywheel labels accept`, the right call). Arms:

  imitation    SFT on every logged answer (the same logs with the ratings taken out): what plain imitation learns
  sft          SFT under the label policy: down-rated answers held, the corrections trained (`flywheel run`)
  dpo          sft + `flywheel tune dpo` (the corrections' pairs)
  kto          sft + `flywheel tune kto` (thumbs up and corrections desirable, thumbs down undesirable)
  grpo         sft + `flywheel tune grpo` (the scorer's reward against the training split's calls)

All five answer the same held-out requests, generated with another seed and the right calls (`--slip-truth`):
every request in the slip's phrasings plus a seeded sample of the rest, decoded as served (under the grammar), in
one `flywheel eval`. Reported per arm: the slip intent's name accuracy, every other tool's exact match, wrong
writes; paired against sft with 95 % intervals (`pipelines.stats.interval`, McNemar), and the acceptance verdict
(a method fixes the slip: >= 0.8 name accuracy on it and >= 0.3 above sft, point estimates as the issue states
them, the intervals beside them; every other tool non-inferior to imitation's SFT at margin 0.02, pooled and per
tool; no more wrong writes than imitation). The cost of each method (seconds, tokens) comes from its
run. Writes bench/results/tune_slip.json (commit, settings, seeds, n) and keeps the evaluation's HTML report
under the work folder.

Usage: .venv/bin/python bench/slip.py [--work /tmp/flywheel-slip] [--records 9000] [--days 6]
       [--eval-only | --resume | --verdict-only]
--eval-only evaluates and reports again from an earlier run's roots and tuned adapters; --resume goes on from the
last step an earlier run finished (its state in the work folder); --verdict-only recomputes the verdict from
the last evaluation's report without evaluating again. Not part of `make test` (the results file records how long
it ran).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from real_data import commit, flywheel  # noqa: E402 (the bench folder's own module)

SLIP = "get_order:track_shipment:0.3"
INTENT, WRONG = "get_order", "track_shipment"
MARGIN = 0.02  # non-inferiority margin for every other tool
FIX_FLOOR, FIX_GAIN = 0.8, 0.3  # the slip is fixed: name accuracy >= 0.8 and >= 0.3 above sft
DAG_ENV = {  # the DAG trains and registers the SFT arm; the held-out evaluation below is the evidence
    "FLYWHEEL_EVALUATION__EXAMPLES": "24",
    "FLYWHEEL_EVALUATION__BASELINES": "false",
    "FLYWHEEL_PROMOTION__BASELINE": "none",
    "FLYWHEEL_AIRFLOW__RUN_TIMEOUT_S": "5400",
    "FLYWHEEL_TRAIN__SWEEP": str(REPO / "bench" / "sweeps" / "slip.yaml"),
}
# The tune methods' settings for this run (chosen before it ran, recorded in the results): the same optimizer
# budget for DPO and KTO, learning rates a tenth of SFT's for a LoRA on this model, GRPO at its defaults but for
# the learning rate and a shorter run (each of its steps samples and scores two groups of answers).
TUNE_ENV = {
    "dpo": {"FLYWHEEL_TUNE__DPO__LEARNING_RATE": "2e-4", "FLYWHEEL_TUNE__DPO__MAX_STEPS": "60",
            "FLYWHEEL_TUNE__DPO__MIN_PAIRS": "8"},
    "kto": {"FLYWHEEL_TUNE__KTO__LEARNING_RATE": "2e-4", "FLYWHEEL_TUNE__KTO__MAX_STEPS": "60",
            "FLYWHEEL_TUNE__KTO__BATCH_SIZE": "8"},
    "grpo": {"FLYWHEEL_TUNE__GRPO__LEARNING_RATE": "5e-5", "FLYWHEEL_TUNE__GRPO__MAX_STEPS": "30"},
}  # fmt: skip
METHODS = ("dpo", "kto", "grpo")


def run(root: Path, *args: str, log: Path, env: dict[str, str] | None = None, timeout_s: float = 6300) -> str:
    """One `flywheel` command on `root` as a user runs it (`real_data.flywheel`); stdout returned."""
    return flywheel(root, *args, log=log, timeout_s=timeout_s, extra=env)


def as_json(out: str) -> Any:
    return json.JSONDecoder().raw_decode(out[out.index("{") :])[0]


def generate(root: Path, log: Path, args: argparse.Namespace, today: str) -> None:
    run(root, "logs", "generate", "--records", str(args.records), "--days", str(args.days), "--end-date", today,
        "--seed", str(args.seed), "--bad-share", "0.02", "--slip", SLIP, log=log)  # fmt: skip


def strip_ratings(raw: Path) -> int:
    """The imitation arm's logs: every rating taken out (nothing held as down-rated: SFT imitates every answer)."""
    changed = 0
    for path in sorted(raw.glob("dt=*/*.jsonl")):
        lines = []
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                lines.append(line)  # a broken line on purpose: prep quarantines it either way
                continue
            if isinstance(record, dict) and record.get("feedback") in ("up", "down"):
                record["feedback"] = "none"
                changed += 1
            lines.append(json.dumps(record) if isinstance(record, dict) else line)
        path.write_text("\n".join(lines) + "\n")
    return changed


def correct(root: Path, log: Path, args: argparse.Namespace, today: str) -> dict[str, int]:
    """Prep the window, then a reviewer corrects `args.correct` of the down-rated slips (a seeded draw) with the
    right call and rejects the rest: the corrections land in today's raw partition, which the DAG prepares."""
    run(root, "prep", "--end-date", today, "--window-days", str(args.days), log=log)
    queue = as_json(run(root, "labels", "review", "--json", log=log))["queue"]
    rng = random.Random(args.seed)
    accepted = 0
    for item in queue:
        if item["tool"] == WRONG and rng.random() < args.correct:
            call = {"name": INTENT, "arguments": json.loads(item["arguments"])}
            run(root, "labels", "accept", item["record_id"], "--call", json.dumps(call), "--reviewer", "bench", log=log)
            accepted += 1
        else:
            run(root, "labels", "reject", item["record_id"], "--reviewer", "bench", log=log)
    return {"queued": len(queue), "corrected": accepted}


def train(root: Path, log: Path, args: argparse.Namespace, today: str) -> str:
    """The whole DAG on the window (the label policy applied by prep), tune off; the version it registered."""
    window = ("--end-date", today, "--window-days", str(args.days))
    run(root, "run", *window, "--source", "landed", "--no-deploy", log=log, env=DAG_ENV)
    versions = as_json(run(root, "registry", "list", "--json", log=log))["versions"]
    if not versions:
        raise SystemExit(f"error: the DAG registered no version under {root}; see {log}")
    return str(max(int(v["version"]) for v in versions))


def registered_adapter(root: Path, version: str, dst: Path) -> Path:
    """A registered version's adapter copied to `dst`, with the prompt style it trained with beside it (what
    `flywheel eval --adapter` reads)."""
    import mlflow
    from pipelines.clients.mlflow import use_tracking
    from pipelines.config import load_settings
    from pipelines.registry.models import prompt_style
    from pipelines.toolcall.examples import PROMPT_STYLE_FILE

    settings = load_settings(root=str(root))
    use_tracking(settings)
    if dst.exists():
        shutil.rmtree(dst)
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{settings.mlflow.registered_model}/{version}"))
    shutil.copytree(local / "artifacts" / "adapter", dst)
    (dst / PROMPT_STYLE_FILE).write_text(str(prompt_style(settings, version)))
    return dst


def heldout(work: Path, log: Path, args: argparse.Namespace, today: str) -> tuple[Path, dict[str, bool]]:
    """Held-out requests with the right calls: another seed's sessions, every slip-phrased turn and a seeded
    sample of `args.others` other turns; record id -> whether it is in the slip's phrasings."""
    raw = work / "heldout-raw"
    if raw.exists():
        shutil.rmtree(raw)
    run(work / "policy", "logs", "generate", "--records", str(args.heldout_records), "--days", "1",
        "--end-date", today, "--seed", str(args.heldout_seed), "--bad-share", "0", "--slip", SLIP, "--slip-truth",
        "--out", str(raw), log=log)  # fmt: skip
    lines = [line for path in sorted(raw.glob("dt=*/*.jsonl")) for line in path.read_text().splitlines() if line]
    records = [json.loads(line) for line in lines]
    slip = [line for line, r in zip(lines, records, strict=True) if r.get("scenario") == "slip"]
    rest = [line for line, r in zip(lines, records, strict=True) if r.get("scenario") != "slip"]
    chosen = slip + random.Random(args.heldout_seed).sample(rest, min(args.others, len(rest)))
    out = work / "heldout.jsonl"
    out.write_text("\n".join(chosen) + "\n")
    return out, {json.loads(line)["record_id"]: json.loads(line).get("scenario") == "slip" for line in chosen}


def tune(root: Path, log: Path, method: str, version: str) -> dict[str, Any]:
    out = run(root, "tune", method, "--version", version, "--json", log=log, env=TUNE_ENV[method])
    return as_json(out)


def verdict(report: dict[str, Any], slips: dict[str, bool]) -> dict[str, Any]:
    """Per arm: the slip intent's name accuracy, the other tools' exact match (pooled and per tool), wrong writes;
    each tuned arm paired against sft (and imitation) with 95 % intervals; whether the acceptance holds."""
    from pipelines.stats import interval, mcnemar

    conditions = report["conditions"]
    served = [c for c in conditions if c["condition"].endswith("_constrained")] or conditions  # as served only
    rows = {r["condition"].removesuffix("_constrained").removeprefix("tuned_"): r for r in served}
    versions = [k for k in rows if k.startswith("v") and k[1:].isdigit()]
    if len(versions) != 1 or "imitation" not in rows:
        raise SystemExit(f"error: the evaluation has no single SFT version and imitation arm: {sorted(rows)}")
    rows["sft"] = rows.pop(versions[0])  # `--version N`: the policy's SFT
    order = sorted(rows["sft"]["per_request"], key=lambda r: r["record_id"])
    ids = [r["record_id"] for r in order]
    slip_ids = [i for i in ids if slips.get(i)]
    other_ids = [i for i in ids if not slips.get(i)]
    arms: dict[str, Any] = {}
    per: dict[str, dict[str, dict[str, Any]]] = {}
    for arm, row in rows.items():
        by = {r["record_id"]: r for r in row["per_request"]}
        per[arm] = by
        tools = sorted({by[i]["tool"] for i in other_ids})
        arms[arm] = {
            "slip_name_accuracy": _mean([by[i]["name_match"] for i in slip_ids]),
            "slip_exact_match": _mean([by[i]["exact_match"] for i in slip_ids]),
            "other_exact_match": _mean([by[i]["exact_match"] for i in other_ids]),
            "other_by_tool": {t: _mean([by[i]["exact_match"] for i in other_ids if by[i]["tool"] == t]) for t in tools},
            "wrong_writes": sum(1 for i in ids if by[i]["wrong_write"]),
            "n": {"slip": len(slip_ids), "other": len(other_ids)},
        }
    comparisons = []
    for arm in rows:
        for ref in ("sft", "imitation"):
            if arm == ref:
                continue
            a, b = per[arm], per[ref]
            slip_a, slip_b = [a[i]["name_match"] for i in slip_ids], [b[i]["name_match"] for i in slip_ids]
            other_a, other_b = [a[i]["exact_match"] for i in other_ids], [b[i]["exact_match"] for i in other_ids]
            tools = sorted({a[i]["tool"] for i in other_ids})
            comparisons.append({
                "arm": arm, "reference": ref,
                "slip_name_accuracy": {**interval(slip_a, slip_b), **mcnemar(slip_a, slip_b)},
                "other_exact_match": {**interval(other_a, other_b), **mcnemar(other_a, other_b)},
                "other_by_tool": {
                    t: interval([a[i]["exact_match"] for i in other_ids if a[i]["tool"] == t],
                                [b[i]["exact_match"] for i in other_ids if b[i]["tool"] == t])
                    for t in tools
                },
                "wrong_writes": {"arm": arms[arm]["wrong_writes"], "reference": arms[ref]["wrong_writes"]},
            })  # fmt: skip
    accepted = {}
    for arm in (*METHODS, "sft"):
        if arm not in arms:
            continue
        vs_sft = next((c for c in comparisons if c["arm"] == arm and c["reference"] == "sft"), None)
        vs_imitation = next(c for c in comparisons if c["arm"] == arm and c["reference"] == "imitation")
        fixed = _at_least(arms[arm]["slip_name_accuracy"], FIX_FLOOR) and (
            vs_sft is not None and _at_least(vs_sft["slip_name_accuracy"]["diff"], FIX_GAIN)
        )
        pooled = _above(vs_imitation["other_exact_match"]["low"], -MARGIN)
        tools_held = {t: _above(c["low"], -MARGIN) for t, c in vs_imitation["other_by_tool"].items()}
        writes = arms[arm]["wrong_writes"] <= arms["imitation"]["wrong_writes"]
        accepted[arm] = {
            "slip_fixed": fixed,
            "others_non_inferior_pooled": pooled,
            "others_non_inferior_every_tool": all(tools_held.values()),
            "tools_not_shown_non_inferior": sorted(t for t, ok in tools_held.items() if not ok),
            "no_more_wrong_writes": writes,
            "passes": fixed and pooled and all(tools_held.values()) and writes,  # the rule as the issue states it
            "passes_pooled": fixed and pooled and writes,  # per tool, n is rarely enough to show 0.02
        }
    return {"arms": arms, "comparisons": comparisons, "acceptance": accepted}


def _slip_ratings() -> dict[str, float]:
    """The shares of the slip's answers people rate down, and of the other answers up (the generator's `Slip`)."""
    from pipelines.simulate.generator import Slip

    slip = Slip.parse(SLIP)
    return {"slipped_rated_down": slip.down, "others_rated_up": slip.up}


def _at_least(value: float | None, bound: float) -> bool:
    return value is not None and value >= bound  # nothing measured: not shown


def _above(value: float | None, bound: float) -> bool:
    return value is not None and value > bound


def _mean(values: list[Any]) -> float | None:
    values = [float(v) for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/flywheel-slip"))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tune_slip.json")
    parser.add_argument("--records", type=int, default=9000, help="generated turns of the training window")
    parser.add_argument("--days", type=int, default=6)
    parser.add_argument("--seed", type=int, default=7, help="the training traffic's seed (and the reviewer's draw)")
    parser.add_argument("--correct", type=float, default=0.5, help="share of the down-rated slips a person corrects")
    parser.add_argument("--heldout-records", type=int, default=5000)
    parser.add_argument("--heldout-seed", type=int, default=1007)
    parser.add_argument("--others", type=int, default=300, help="held-out requests not in the slip's phrasings")
    parser.add_argument("--eval-only", action="store_true", help="evaluate and report again from an earlier run")
    parser.add_argument("--resume", action="store_true", help="go on from the last step an earlier run finished")
    parser.add_argument(
        "--verdict-only", action="store_true", help="recompute the verdict from the last evaluation's report"
    )
    args = parser.parse_args()
    if args.verdict_only:
        return verdict_only(args)
    lock = hold(args.work)  # noqa: F841 (held until the process ends)
    started = time.perf_counter()
    measured = commit()
    today = datetime.now(UTC).date().isoformat()
    work, log = args.work, args.work / "run.log"
    policy, imitation = work / "policy", work / "imitation"
    state = work / "state.json"
    if not (args.eval_only or args.resume):
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        log.write_text("")
        save_state(state, {"today": today})
    saved = load_state(state, ("today",))
    today = saved["today"]

    def step(key: str, what: str, do: Any) -> None:
        """Run one step unless an earlier run of this script finished it (`--resume`), then record it."""
        if key in saved:
            return
        print(what, flush=True)
        saved[key] = do()
        save_state(state, saved)

    if not args.eval_only:
        step(
            "stripped",
            "imitation: the logs with the ratings taken out ...",
            lambda: (generate(imitation, log, args, today), strip_ratings(imitation / "raw"))[1],
        )
        step("imitation_version", "imitation: the DAG ...", lambda: train(imitation, log, args, today))
        step(
            "reviewed",
            "sft: the same logs with their ratings, a reviewer's corrections ...",
            lambda: (generate(policy, log, args, today), correct(policy, log, args, today))[1],
        )
        step("version", "sft: the DAG ...", lambda: train(policy, log, args, today))
        for method in METHODS:
            step(
                f"tuned_{method}",
                f"{method}: flywheel tune {method} --version {saved['version']} ...",
                lambda method=method: tune(policy, log, method, saved["version"]),
            )
        saved["tuned"] = {m: saved[f"tuned_{m}"] for m in METHODS}
        save_state(state, saved)
    if "tuned" not in saved:
        print(f"error: --eval-only: the run under {work} has not finished its training steps (use --resume)",
              file=sys.stderr)  # fmt: skip
        return 2
    version = saved["version"]
    adapters = {"imitation": registered_adapter(imitation, saved["imitation_version"], work / "adapters" / "imitation")}
    for method, result in saved["tuned"].items():
        if result.get("skipped"):
            print(f"{method}: {result['skipped']}", flush=True)
            continue
        adapters[method] = Path(result["adapter_dir"])
    heldout_file, slips = heldout(work, log, args, today)
    print(f"evaluating {len(adapters) + 1} arms on {len(slips)} held-out requests ...", flush=True)
    options = [x for label, path in adapters.items() for x in ("--adapter", f"{label}={path}")]
    out = run(policy, "eval", "--logs", str(heldout_file), "--examples", str(len(slips)), "--no-baselines",
              "--version", version, *options, "--name", "slip", "--json", log=log, timeout_s=10800)  # fmt: skip
    report = as_json(out)
    found = verdict(report, slips)
    result = {
        "benchmark": "tune_slip",
        "what": "tuning from outcomes on an injected teacher slip: SFT by imitation, SFT under the label policy, "
        "and DPO, KTO, GRPO on top of it, on held-out requests whose truth is known",
        "commit": measured,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "argv": sys.argv,
        "settings": {
            "slip": SLIP,
            "slip_ratings": _slip_ratings(),
            "records": args.records,
            "days": args.days,
            "correct": args.correct,
            "heldout_records": args.heldout_records,
            "others": args.others,
            "dag_env": DAG_ENV,
            "tune_env": TUNE_ENV,
            "decoding": "as served (evaluation.constrained: served)",
            "margin": MARGIN,
            "fix_floor": FIX_FLOOR,
            "fix_gain": FIX_GAIN,
        },  # fmt: skip
        "seeds": {
            "traffic": args.seed,
            "reviewer": args.seed,
            "heldout": args.heldout_seed,
            "sweep": 0,
            "tune": "tune.<method>.seed (0)",
            "bootstrap": 0,
        },  # fmt: skip
        "signals": {"ratings_stripped_for_imitation": saved["stripped"], **saved["reviewed"]},
        "versions": {"sft": version, "imitation": saved["imitation_version"]},
        "cost": {
            m: {
                k: r.get(k)
                for k in (
                    "seconds",
                    "tokens",
                    "steps",
                    "pairs",
                    "rows",
                    "desirable",
                    "undesirable",
                    "prompts",
                    "skipped",
                )
            }
            for m, r in saved["tuned"].items()
        },  # fmt: skip
        "evaluation": {
            "report": report.get("html_uri"),
            "seconds": report.get("seconds"),
            "settings": report.get("settings"),
        },  # fmt: skip
        **found,
        "seconds": round(time.perf_counter() - started),
    }
    write_results(args.out, result)
    return 0


def verdict_only(args: argparse.Namespace) -> int:
    """The verdict computed again from the last run's evaluation report (the platform's own report file) and
    held-out set, into the results file it wrote: the measured figures keep that run's commit and date."""
    try:
        report = json.loads((args.work / "policy" / "reports" / "evaluation" / "slip" / "report.json").read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: --verdict-only: no evaluation report under {args.work} ({exc})") from None
    slips = {}
    for line in (args.work / "heldout.jsonl").read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            slips[record["record_id"]] = record.get("scenario") == "slip"
    result = json.loads(args.out.read_text())
    result.update(verdict(report, slips))
    result["verdict_recomputed"] = {"commit": commit(), "at": datetime.now(UTC).isoformat(timespec="seconds")}
    write_results(args.out, result)
    return 0


def hold(work: Path) -> Any:
    """The work folder's lock (`storage.locked`: a file beside the folder, so a fresh run's `rmtree` keeps it),
    held until this process ends: a second run on the same folder stops at once with one `error:` line instead of
    deleting the first's."""
    from contextlib import ExitStack

    from pipelines.storage import Busy, locked

    work.parent.mkdir(parents=True, exist_ok=True)
    held = ExitStack()
    try:
        held.enter_context(locked(str(work), 0, f"the work folder {work}"))
    except Busy:
        raise SystemExit(f"error: another run is using {work}: wait for it, or give another --work") from None
    return held


def save_state(state: Path, saved: dict[str, Any]) -> None:
    """A run's state (the steps it finished), written atomically and synced (`storage.write_json`): a crash
    mid-write leaves the last one."""
    from pipelines.storage import write_json

    write_json(str(state), saved)


def load_state(state: Path, required: tuple[str, ...]) -> dict[str, Any]:
    """The state an earlier run left (holding the `required` keys), or one `error:` line (exit 1) when there is
    none to go on from."""
    try:
        saved = json.loads(state.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"error: no earlier run to go on from in {state.parent} ({exc.__class__.__name__})") from None
    if not isinstance(saved, dict) or not set(required) <= set(saved):
        raise SystemExit(f"error: {state} is not a state this script wrote (it needs {', '.join(required)}): run "
                         "again without --resume to start over")  # fmt: skip
    return saved


def write_results(out: Path, result: dict[str, Any]) -> None:
    """The results file, written atomically (`storage.write_text`), and the arms' figures and verdicts printed."""
    from pipelines.storage import write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(str(out), json.dumps(result, indent=1) + "\n")
    for arm, row in result["arms"].items():
        print(f"{arm:<10} slip name {row['slip_name_accuracy']}  others exact {row['other_exact_match']}  "
              f"wrong writes {row['wrong_writes']}")  # fmt: skip
    for arm, row in result["acceptance"].items():
        print(f"{arm:<10} {row}")
    print(f"wrote {out}")


def machine() -> str:
    """The CPU, its cores and whether it has bf16 units (without them a bf16 setting computes in fp32)."""
    from pipelines.hardware import cpu_has_bf16, cpu_model

    return f"{cpu_model()}, {os.cpu_count()} cores, bf16 units: {'yes' if cpu_has_bf16() else 'no'}"


if __name__ == "__main__":
    sys.exit(main())
