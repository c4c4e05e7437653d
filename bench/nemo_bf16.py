"""Which op makes NeMo AutoModel's bf16 training steps slower on this CPU (issue 52).

The `nemo` backend trains in fp32 on CPU (an earlier note said FSDP2's default mixed precision ran slower). On one
rank NeMo does not shard: its default policy (`param_dtype` bf16) casts the frozen base and the LoRA adapter to
bf16 once at setup, so every step computes in bf16. This bench runs the same recipe, data and seed both ways and
profiles the steps after the first `--skip` with torch.profiler (inside the NeMo environment,
bench/nemo_profile_shim.py):

- `fp32`: what the backend runs on CPU (the model in fp32, FSDP2 without a mixed-precision policy);
- `bf16`: FSDP2Config's default policy (the model cast to bf16 at setup, the optimizer on bf16 adapter weights).

It reports each arm's step seconds (each timed step, profiler overhead included, and not the profiler's
aggregation) and, per op, the self CPU time per profiled step, and names the ops whose time grew most from fp32
to bf16. Results: --out (default bench/results/nemo_bf16_ops_cpu.json).

Usage: .venv/bin/python bench/nemo_bf16.py [--steps 8] [--skip 3] [--batch-size 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path

import pandas as pd
import yaml

from pipelines.base_models import prepare_base
from pipelines.config import REPO_ROOT, load_settings
from pipelines.prep.nodes import prepare_line
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator
from pipelines.toolcall.examples import to_examples, training_pairs
from pipelines.train.hf_backend import TrainConfig
from pipelines.train.nemo_backend import _launch_env, recipe, write_chat_dataset

ARMS = ("fp32", "bf16")
GENERATOR_SEED = 2
# what an op is, for the per-kind sums (the profiler's self times, so nothing is counted twice)
KINDS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"),
    "cast and copy": ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous"),
    "attention": ("aten::_scaled_dot_product", "aten::scaled_dot_product", "aten::_softmax", "aten::softmax"),
    "loss": ("aten::log_softmax", "aten::_log_softmax", "aten::nll_loss", "aten::cross_entropy"),
    "optimizer": ("aten::_foreach", "Optimizer."),
}


def kind_of(op: str) -> str:
    return next((k for k, prefixes in KINDS.items() if op.startswith(prefixes)), "other")


def arm_spec(spec: dict, arm: str) -> dict:
    """The backend's CPU recipe, changed only as the arm says."""
    spec = json.loads(json.dumps(spec))
    if arm == "bf16":
        spec["distributed"].pop("mp_policy", None)  # FSDP2Config's default: param_dtype bf16
    spec["checkpoint"]["enabled"] = False
    return spec


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=False, timeout=60).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=3, help="steps run before profiling starts (warm-up)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--root", default=".flywheel", help="where the dequantized base model is cached")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per arm")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "nemo_bf16_ops_cpu.json")
    args = parser.parse_args()
    if args.steps <= args.skip:
        print("error: --steps must be larger than --skip (nothing would be profiled)", file=sys.stderr)
        return 2
    settings = load_settings(root=args.root)
    gen = TrafficGenerator(
        GeneratorConfig(seed=GENERATOR_SEED, records=400, bad_share=0.0, end_date=date(2026, 11, 20))
    )
    rows = [r for r in (prepare_line(line) for _, line, _ in gen.lines()) if r["status"] == "clean"]
    examples = training_pairs(to_examples(pd.DataFrame(rows).assign(context=""), "short"))
    cfg = TrainConfig(
        base_model=args.model, max_steps=args.steps, batch_size=args.batch_size, lora_rank=args.rank,
        lora_alpha=2 * args.rank, checkpoint_every=10_000, warmup_steps=2, max_seq_len=768,
    )  # fmt: skip
    base = prepare_base(args.model, settings)
    from transformers import AutoConfig

    layers = AutoConfig.from_pretrained(base).num_hidden_layers
    work = Path(tempfile.mkdtemp(prefix="bench-nemo-bf16-"))
    arms: dict[str, dict] = {}
    try:
        train_file = work / "train.jsonl"
        write_chat_dataset(examples, train_file)
        spec = recipe(cfg, base_model_path=base, num_layers=layers, train_file=str(train_file),
                      checkpoint_dir=str(work / "ckpt"), examples=len(examples), gpus=0)  # fmt: skip
        for arm in ARMS:
            config = work / f"{arm}.yaml"
            config.write_text(yaml.safe_dump(arm_spec(spec, arm), sort_keys=False))
            ops_file = work / f"{arm}.json"
            command = [settings.train.nemo_python, str(REPO_ROOT / "bench" / "nemo_profile_shim.py"),
                       "--out", str(ops_file), "--skip", str(args.skip), "--config", str(config)]  # fmt: skip
            print(f"{arm}: {args.steps} steps, profiling after {args.skip} ...", flush=True)
            log = work / f"{arm}.log"
            with log.open("w") as handle:
                try:
                    code = subprocess.run(command, env=_launch_env(0), stdout=handle, stderr=subprocess.STDOUT,
                                          timeout=args.timeout, check=False).returncode  # fmt: skip
                except subprocess.TimeoutExpired:
                    code = None
            if code != 0 or not ops_file.is_file():
                tail = log.read_text(errors="replace")[-1500:]
                arms[arm] = {"error": f"exit {code} (None: past --timeout)", "log_tail": tail}
                print(f"{arm}: failed ({code}); log tail:\n{tail}", flush=True)
                continue
            state = json.loads(ops_file.read_text())
            profiled = state["step_seconds"][args.skip :]
            n = max(1, state["profiled_steps"])
            per_step: dict[str, float] = {}
            for k, v in state["ops"].items():  # a compiled graph's hash differs per arm: one row per kind of op
                op = re.sub(r"CompiledFxGraph \w+", "CompiledFxGraph", k)
                per_step[op] = round(per_step.get(op, 0.0) + v["self_us"] / n / 1000, 3)
            kinds: dict[str, float] = {}
            for op, ms in per_step.items():
                kinds[kind_of(op)] = round(kinds.get(kind_of(op), 0.0) + ms, 3)
            fsdp = {k: round(v["total_us"] / n / 1000, 3) for k, v in state["ops"].items() if k.startswith("FSDP::")}
            arms[arm] = {
                "step_seconds": state["step_seconds"],
                "profiled_steps": state["profiled_steps"],
                "median_profiled_step_s": round(statistics.median(profiled), 3) if profiled else None,
                "self_ms_per_step_by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
                "fsdp_ms_per_step_inclusive": dict(sorted(fsdp.items(), key=lambda kv: -kv[1])[:8]),
                "top_ops_self_ms_per_step": dict(sorted(per_step.items(), key=lambda kv: -kv[1])[:15]),
                "_all": per_step,
            }
            print(f"{arm}: median profiled step {arms[arm]['median_profiled_step_s']} s; by kind "
                  f"{arms[arm]['self_ms_per_step_by_kind']}", flush=True)  # fmt: skip
        growth = None
        medians = [arms.get(a, {}).get("median_profiled_step_s") for a in ARMS]
        if all("_all" in arms.get(a, {}) for a in ARMS) and all(medians):
            fp32, bf16 = arms["fp32"]["_all"], arms["bf16"]["_all"]
            deltas = {op: round(bf16.get(op, 0.0) - fp32.get(op, 0.0), 3) for op in set(fp32) | set(bf16)}
            top = sorted(deltas.items(), key=lambda kv: -kv[1])[:10]
            growth = {
                "step_ratio_bf16_over_fp32": round(medians[1] / medians[0], 2),
                "ops_that_grew_most_ms_per_step": [
                    {"op": op, "fp32_ms": fp32.get(op, 0.0), "bf16_ms": bf16.get(op, 0.0), "added_ms": d}
                    for op, d in top
                ],
                "added_ms_per_step_total": round(sum(deltas.values()), 1),
            }
        for arm in arms.values():
            arm.pop("_all", None)
        import torch

        probe = [settings.train.nemo_python, "-c", "import torch; print(torch.__version__)"]
        nemo_torch = subprocess.run(probe, capture_output=True, text=True, check=False, timeout=300).stdout.strip()
        from pipelines.hardware import cpu_model

        report = {
            "benchmark": "nemo_bf16",
            "what": "NeMo AutoModel's LoRA recipe on CPU, one rank: fp32 against FSDP2Config's default bf16 policy "
            "(the model cast to bf16 at setup), the same data and seed; step seconds and per-op self CPU time per "
            "profiled step (torch.profiler)",
            "commit": {"sha": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))},
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {
                "cpu": cpu_model(),
                "cores": os.cpu_count(),
                "torch_main": torch.__version__,
                "torch_nemo": nemo_torch,
            },  # fmt: skip
            "argv": ["bench/nemo_bf16.py", *sys.argv[1:]],
            "seeds": {"generator": GENERATOR_SEED, "train": cfg.seed},
            "settings": {
                "model": args.model,
                "steps": args.steps,
                "skip": args.skip,
                "batch_size": args.batch_size,
                "rank": args.rank,
                "max_seq_len": cfg.max_seq_len,
                "examples": len(examples),
            },  # fmt: skip
            "n": {"profiled_steps_per_arm": args.steps - args.skip},
            "arms": arms,
            "growth": growth,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        partial = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(partial, args.out)
        print(f"wrote {args.out}")
        return 0 if all("error" not in a for a in arms.values()) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
