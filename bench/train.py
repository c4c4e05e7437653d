"""LoRA training throughput (tokens/s) of the hf and nemo backends side by side, same data and
hyperparameters, on real SmolLM2-135M (fp32 on CPU; bf16 and NCCL on a GPU node).

Usage: .venv/bin/python bench/train.py [--steps 10] [--batch-size 4] [--rank 16] [--backends hf,nemo]
The nemo backend needs `make nemo-env`. Its figure is the recipe's own tokens/s (median over steps,
first step excluded); the hf figure counts the same padded-batch tokens over the whole loop.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile
from datetime import date
from pathlib import Path

import pandas as pd
import torch

from pipelines.config import load_settings
from pipelines.logs.generator import GeneratorConfig, TrafficGenerator
from pipelines.prep.nodes import prepare_line
from pipelines.train.dataset import to_examples, training_pairs
from pipelines.train.hf_backend import TrainConfig, train_lora
from pipelines.train.models import load_base
from pipelines.train.nemo_backend import train_nemo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--root", default=".flywheel", help="where the dequantized base model is cached")
    parser.add_argument("--backends", default="hf,nemo")
    parser.add_argument("--prompt", choices=["short", "full"], default="short")
    args = parser.parse_args()
    settings = load_settings(root=args.root)
    gen = TrafficGenerator(GeneratorConfig(seed=2, records=400, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [r for r in (prepare_line(line) for _, line, _ in gen.lines()) if r["status"] == "clean"]
    frame = pd.DataFrame(rows).assign(context="")
    examples = training_pairs(to_examples(frame, args.prompt))
    out = Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        load_base("smollm2-135m-instruct", settings)  # cache outside the timing
        cfg = TrainConfig(base_model="smollm2-135m-instruct", max_steps=args.steps, batch_size=args.batch_size,
                          lora_rank=args.rank, lora_alpha=2 * args.rank, checkpoint_every=10_000, warmup_steps=2)
        print(f"hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
              f"{torch.__version__}, threads {torch.get_num_threads()}, fp32; {args.prompt} prompt")
        print(f"{'backend':<8}{'model':<24}{'rank':>5}{'batch':>6}{'steps':>6}{'seconds':>9}"
              f"{'tokens/s':>10}{'loss first->last':>20}")
        for backend in args.backends.split(","):
            if backend == "hf":
                result = train_lora(examples, cfg, out / backend, lambda name: load_base(name, settings))
            else:
                result = train_nemo(settings, cfg, examples, out / backend, gpus=torch.cuda.device_count())
            print(f"{backend:<8}{'smollm2-135m-instruct':<24}{args.rank:>5}{args.batch_size:>6}{result.steps:>6}"
                  f"{result.seconds:>9.1f}{result.tokens_per_s:>10.1f}"
                  f"{result.losses[0]:>10.3f} -> {result.losses[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
