"""LoRA training throughput (tokens/s) of the hf and nemo backends side by side, same data and
hyperparameters: real SmolLM2-135M (fp32 on CPU), or on a GPU node (bf16, NCCL) any catalogue model,
e.g. `llama-8b-shape-random` (Llama-3.1-8B's shape, random weights), with MFU against the hardware table.

Usage: .venv/bin/python bench/train.py [--steps 10] [--batch-size 4] [--rank 16] [--backends hf,nemo]
                                       [--model smollm2-135m-instruct] [--pack 1024]
       .venv/bin/python bench/train.py --precision fp32,bf16 --sweep conf/sweeps/demo.yaml --steps 120 \
                                       --eval 96 --out bench/results/train_precision_cpu.json
With --precision the hf backend trains the sweep's first variant once per precision (same seed, same data, same
steps), prints tokens/s and writes the per-step losses; --eval N then decodes N held-out requests with each adapter
(as served: under the grammar) and compares their exact match paired against fp32 (95 % bootstrap interval).
With --pack P every backend runs twice on the same steps, unpacked and with each step's examples packed into
rows of up to P tokens (`packed_seq_len`), and the packed/unpacked throughput ratio is printed per backend.
The nemo backend needs `make nemo-env` (on a GPU node, the NeMo container's python via
FLYWHEEL_TRAIN__NEMO_PYTHON). Its figure is the recipe's own tokens/s (median over steps, first step
excluded); the hf figure counts the non-padding tokens over the whole loop. MFU counts 4 x (parameters
outside the input embedding) FLOPs per token (LoRA: no weight gradients for frozen weights).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import tempfile
from datetime import date
from pathlib import Path

import pandas as pd
import torch

from pipelines.base_models import load_base, prepare_base
from pipelines.config import load_settings
from pipelines.hardware import detect, mfu, training_flops_per_token
from pipelines.prep.nodes import prepare_line
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator
from pipelines.toolcall.examples import to_examples, training_pairs
from pipelines.train.hf_backend import TrainConfig, train_lora
from pipelines.train.nemo_backend import train_nemo


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--root", default=".flywheel", help="where the dequantized base model is cached")
    parser.add_argument("--backends", default="hf,nemo")
    parser.add_argument("--prompt", choices=["short", "full"], default="short")
    parser.add_argument("--keep", default=None, help="keep adapters and logs in this folder (default: removed)")
    parser.add_argument("--model", default="smollm2-135m-instruct", help="catalogue name or local folder")
    parser.add_argument("--pack", type=int, default=None, help="also run packed into rows of this many tokens")
    parser.add_argument("--precision", default=None, help="fp32,bf16: the hf backend once per precision, side by side")
    parser.add_argument("--sweep", default=None, help="with --precision: train this sweep's first variant")
    parser.add_argument("--eval", type=int, default=0, help="with --precision: held-out requests to compare on")
    parser.add_argument("--out", default=None, help="with --precision: the results JSON")
    args = parser.parse_args()
    if args.precision:
        from precision import compare_precisions

        compare_precisions(args)
        return
    settings = load_settings(root=args.root)
    gen = TrafficGenerator(GeneratorConfig(seed=2, records=400, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [r for r in (prepare_line(line) for _, line, _ in gen.lines()) if r["status"] == "clean"]
    frame = pd.DataFrame(rows).assign(context="")
    examples = training_pairs(to_examples(frame, args.prompt))
    out = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-train-"))
    try:
        flops_per_token = training_flops_per_token(_params_outside_embedding(prepare_base(args.model, settings)))
        cfg = TrainConfig(
            base_model=args.model,
            max_steps=args.steps,
            batch_size=args.batch_size,
            lora_rank=args.rank,
            lora_alpha=2 * args.rank,
            checkpoint_every=10_000,
            warmup_steps=2,
            max_seq_len=min(768, args.pack or 768),
        )
        hardware = detect(settings.bench.hardware)
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        print(
            f"hardware: {gpu or platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
            f"{torch.__version__}, {'bf16' if gpu else f'fp32, threads {torch.get_num_threads()}'}; "
            f"{args.prompt} prompt; {flops_per_token / 4e9:.2f}B parameters outside the embedding"
        )
        print(
            f"{'backend':<8}{'model':<24}{'packed':>7}{'rank':>5}{'batch':>6}{'steps':>6}{'seconds':>9}"
            f"{'tokens/s':>10}{'MFU':>7}{'loss first->last':>20}"
        )
        for backend in args.backends.split(","):
            rates = {}
            for pack in [None, args.pack] if args.pack else [None]:
                variant = cfg.model_copy(update={"packed_seq_len": pack})
                where = out / f"{backend}-{pack or 'unpacked'}"
                if backend == "hf":
                    result = train_lora(examples, variant, where, lambda name: load_base(name, settings))
                else:
                    result = train_nemo(settings, variant, examples, where, gpus=torch.cuda.device_count())
                gc.collect()
                torch.cuda.empty_cache()  # no-op on CPU; on a GPU the next backend (another process) needs it
                util = mfu(result.tokens_per_s, flops_per_token, hardware)
                rates[pack] = result.tokens_per_s
                print(
                    f"{backend:<8}{args.model[:23]:<24}{pack or '-':>7}{args.rank:>5}{args.batch_size:>6}"
                    f"{result.steps:>6}{result.seconds:>9.1f}{result.tokens_per_s:>10.1f}"
                    f"{f'{util:.1%}' if util else '-':>7}{result.losses[0]:>10.3f} -> {result.losses[-1]:.3f}",
                    flush=True,
                )
            if args.pack and rates.get(None):
                print(
                    f"{backend}: packed into {args.pack}-token rows / unpacked tokens/s = "
                    f"{rates[args.pack] / rates[None]:.2f}x",
                    flush=True,
                )
    finally:
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)


def _params_outside_embedding(model_dir: str) -> int:
    """Parameter count of the model's shape (built on the meta device: no memory) minus the input embedding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()


if __name__ == "__main__":
    main()
