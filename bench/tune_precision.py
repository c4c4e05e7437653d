"""Tuning after SFT on the CPU in fp32 and in bf16, side by side (issue 52 for the tune methods): the same DPO run
(pairs, SFT adapter, seed, steps) once per precision, through `pipelines.tune.dpo.train_dpo` exactly as `flywheel
tune dpo` runs it: tokens per second and the per-step losses and reward margins.

bf16 is the tune stage's choice where the CPU has bf16 units (`tune.stage.tune_bf16`: the frozen base cast to
bf16 once, autocast, the adapter and optimizer in fp32, no activation recomputation on the CPU); fp32 computes in
fp32 throughout. It needs a flywheel root with a registered version and preference pairs (`bench/slip.py` leaves
one under its work folder).

Usage: .venv/bin/python bench/tune_precision.py --root /tmp/flywheel-slip/policy [--version 1] [--steps 12]
Writes bench/results/tune_precision_cpu.json (commit, machine, settings, seed). Not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from real_data import commit  # noqa: E402 (the bench folder's own module)


def compared(fp32: dict[str, Any], bf16: dict[str, Any]) -> dict[str, Any]:
    """bf16 against fp32: the speed ratio and the per-step loss's relative difference (bench/precision.py's
    measure; no exact match here: `bench/slip.py` evaluates the adapters the tune methods train in bf16)."""
    steps = min(len(fp32["losses"]), len(bf16["losses"]))
    diffs = [abs(a - b) / max(b, 1e-6) for a, b in zip(bf16["losses"][:steps], fp32["losses"][:steps])]
    return {
        "tokens_per_s_ratio": round(bf16["tokens_per_s"] / fp32["tokens_per_s"], 3),
        "steps_compared": steps,
        "loss_relative_difference_mean": round(sum(diffs) / max(steps, 1), 4),
        "loss_relative_difference_max": round(max(diffs, default=0.0), 4),
        "exact_match": None,
        "n": 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, required=True, help="a flywheel root with a version and pairs")
    parser.add_argument("--version", default="1")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "tune_precision_cpu.json")
    args = parser.parse_args()

    import torch

    from pipelines.base_models import load_base
    from pipelines.config import load_settings
    from pipelines.hardware import cpu_has_bf16, cpu_model
    from pipelines.prep.pairs import collect_pairs
    from pipelines.registry.models import adapter_path, prompt_style
    from pipelines.tune.dpo import preference_rows, train_dpo

    if not cpu_has_bf16():
        print("error: this CPU has no bf16 units (AVX-512 BF16 or AMX): bf16 would be emulated", file=sys.stderr)
        return 2
    measured = commit()
    settings = load_settings(root=str(args.root))
    cfg = settings.tune.dpo.model_copy(update={"max_steps": args.steps, "min_pairs": 1})
    pairs, _, _ = collect_pairs(settings)
    train = pairs[pairs["split"] == "train"]
    if train.empty:
        print(f"error: no training pairs under {args.root}", file=sys.stderr)
        return 2
    rows = preference_rows(train, prompt_style(settings, args.version))
    sft = Path(adapter_path(settings, args.version))
    from pipelines.clients.mlflow import client as mlflow_client

    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, args.version).tags
    base_name = tags["flywheel.base_model"]
    runs: dict[str, Any] = {}
    for precision in ("fp32", "bf16"):
        with tempfile.TemporaryDirectory(prefix=f"tune-{precision}-") as folder:
            print(f"dpo {precision}: {len(rows)} pairs, {args.steps} steps ...", flush=True)
            result = train_dpo(rows, cfg, sft, Path(folder), lambda: load_base(base_name, settings),
                               progress=lambda line: print(line, flush=True), bf16=precision == "bf16")  # fmt: skip
            runs[precision] = {
                "tokens_per_s": round(result.tokens / result.seconds, 1),
                "seconds": result.seconds,
                "steps": result.steps,
                "tokens": result.tokens,
                "losses": result.losses,
                "reward_margins": result.reward_margins,
            }
    fp32, bf16 = runs["fp32"], runs["bf16"]
    result_file = {
        "benchmark": "tune_precision",
        "what": "DPO after SFT on this CPU in fp32 and bf16 side by side: tokens/s, per-step losses and reward margins",
        "commit": measured,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },  # fmt: skip
        "argv": sys.argv,
        "settings": {"dpo": cfg.model_dump(), "pairs": len(rows), "version": args.version, "base_model": base_name},
        "seeds": {"training": cfg.seed},
        "runs": runs,
        "comparisons": {"bf16_vs_fp32": compared(fp32, bf16)},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_name(f".{args.out.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(result_file, indent=1) + "\n")
    os.replace(partial, args.out)
    print(json.dumps(result_file["comparisons"]), f"fp32 {fp32['tokens_per_s']} tok/s, bf16 {bf16['tokens_per_s']}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
