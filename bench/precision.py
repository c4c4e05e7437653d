"""`bench/train.py --precision fp32,bf16`: the hf backend's training on this CPU in each precision, side by side (same
variant, seed, data and steps): tokens/s, the per-step loss curves, and each adapter's exact match on the same
held-out requests (under the grammar, both arms' adapters decoded in fp32: the training precision is what differs),
paired against fp32. Results JSON with commit, machine, settings, seeds."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from pipelines.base_models import load_base
from pipelines.config import REPO_ROOT, load_settings
from pipelines.hardware import cpu_model
from pipelines.prep.nodes import prepare_line
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator
from pipelines.stats import interval
from pipelines.toolcall.examples import to_examples, training_pairs
from pipelines.train.hf_backend import train_lora
from pipelines.train.sweep_config import load_sweep, variant_points

TRAIN_SEED, EVAL_SEED = 2, 91


def _examples(seed: int, records: int, style: str) -> list[Any]:
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=records, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [r for r in (prepare_line(line) for _, line, _ in gen.lines()) if r["status"] == "clean"]
    return to_examples(pd.DataFrame(rows).assign(context=""), style)


def _exact(settings: Any, base_model: str, adapter: str, held_out: list[Any], budget: int) -> list[float]:
    """Each held-out request's exact match (1/0), under the offered tools' grammar, in fp32 for both arms."""
    from pipelines.base_models import load_model
    from pipelines.toolcall import score as m
    from pipelines.toolcall.decode import generate
    from pipelines.toolcall.examples import grounded_tools

    model, tokenizer = load_model(base_model, settings, adapter)
    out = generate(
        model,
        tokenizer,
        [e.turns for e in held_out],
        latency_samples=0,
        max_new_tokens=budget,
        tools=grounded_tools(held_out, None, True),
    )
    return [float(m.score(t, e.expected).exact_match) for t, e in zip(out.texts, held_out)]


def compare_precisions(args: Any) -> None:
    from pipelines.hardware import bf16_comparison_problem

    problem = bf16_comparison_problem(args.precision.split(","))
    if problem:
        raise SystemExit(f"error: --precision {problem}")
    settings = load_settings(root=args.root)
    sweep = load_sweep(args.sweep or str(REPO_ROOT / "conf" / "sweeps" / "demo.yaml"))
    cfg, style = variant_points(sweep)[0]
    cfg = cfg.model_copy(update={"max_steps": args.steps, "epochs": None, "checkpoint_every": 100_000})
    train = training_pairs(_examples(TRAIN_SEED, 1500, style))
    held_out = _examples(EVAL_SEED, 4 * args.eval, style)[: args.eval] if args.eval else []
    runs: dict[str, Any] = {}
    folder = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    for precision in args.precision.split(","):
        variant = cfg.model_copy(update={"precision": precision})
        result = train_lora(train, variant, folder / precision, lambda name: load_base(name, settings))
        runs[precision] = {
            "tokens_per_s": result.tokens_per_s,
            "seconds": result.seconds,
            "steps": result.steps,
            "tokens": result.tokens,
            "losses": result.losses,
            "adapter": result.adapter_dir,
        }
        print(
            f"{precision}: {result.tokens_per_s:.1f} tokens/s over {result.steps} steps "
            f"({result.seconds:.0f} s), loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}",
            flush=True,
        )
        if held_out:
            runs[precision]["exact"] = _exact(settings, cfg.base_model, result.adapter_dir, held_out, 64)
            print(f"{precision}: exact match {sum(runs[precision]['exact']) / len(held_out):.3f}", flush=True)
    report = _report(args, cfg, style, runs, len(held_out))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


def _report(args: Any, cfg: Any, style: str, runs: dict[str, Any], n_eval: int) -> dict[str, Any]:
    base = runs.get("fp32")
    comparisons = {}
    for name, run in runs.items():
        if base is None or name == "fp32":
            continue
        steps = min(len(run["losses"]), len(base["losses"]))
        diffs = [abs(a - b) / max(b, 1e-6) for a, b in zip(run["losses"][:steps], base["losses"][:steps])]
        comparisons[f"{name}_vs_fp32"] = {
            "tokens_per_s_ratio": round(run["tokens_per_s"] / base["tokens_per_s"], 3),
            "steps_compared": steps,
            "loss_relative_difference_mean": round(sum(diffs) / steps, 4),
            "loss_relative_difference_max": round(max(diffs), 4),
            "exact_match": interval(run["exact"], base["exact"]) if n_eval else None,
            "n": n_eval,
        }
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT).stdout.strip()
    return {
        "benchmark": "train_precision",
        "what": "LoRA training on this CPU in fp32 and bf16 side by side: tokens/s, per-step loss, exact match",
        "commit": {
            "sha": commit,
            "dirty": bool(
                subprocess.run(
                    ["git", "status", "--porcelain"], capture_output=True, text=True, cwd=REPO_ROOT
                ).stdout.strip()
            ),
        },
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "argv": ["bench/train.py", "--precision", args.precision, "--steps", str(args.steps), "--eval", str(args.eval)],
        "settings": {"variant": cfg.model_dump(mode="json"), "prompt_style": style},
        "seeds": {"training_data": TRAIN_SEED, "held_out": EVAL_SEED, "training": cfg.seed},
        "runs": {k: {kk: vv for kk, vv in v.items() if kk not in ("adapter",)} for k, v in runs.items()},
        "comparisons": comparisons,
    }
