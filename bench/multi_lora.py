"""Multi-LoRA serving benchmark: N adapters on ONE base model vs merged vs one copy per adapter.

Measures greedy decoding (``generate``, fixed ``--new-tokens`` per request, random prompt ids, random
weights built from a config: no downloads, no tokenizer) under three conditions:

* ``merged``        one adapter merged into the base (``merge_and_unload``): the single-adapter ceiling.
* ``multi_lora_N``  one base + N PEFT LoRA adapters; row j of a batch of c concurrent requests uses
                    adapter j % N via PEFT mixed-batch inference (``generate(..., adapter_names=[...])``).
* ``copies_N``      N merged models resident (one instance per adapter); the rows of a batch are grouped
                    by their copy and the copies run one after another (no batching across instances).
                    Skipped, with the reason recorded, above ``--skip-per-adapter-copies-above``.

Per condition and concurrency: tokens/s (generated tokens / wall, median of --repeats after one
warm-up), p50 latency per request (= the batch's wall time), peak memory (CUDA: max_memory_allocated
after reset_peak_memory_stats, weights included; CPU: process RSS after the run, noisy), plus adapter
and base parameter bytes. Then, per concurrency, the goal check for each multi_lora_N:
throughput >= 90 % of merged, and peak <= base + N x adapter + merged's activation overhead.
Errors (e.g. CUDA OOM) are recorded per row as "error" and the run continues.

Only needs torch, transformers, peft, numpy, pandas, psutil (imports nothing from this repository).
CUDA bf16 when available, else CPU fp32. Examples:
    python bench/multi_lora.py --shape llama-8b --adapters 1,4,16 --concurrency 1,4 --out $OUT/multi_lora.json
    python bench/multi_lora.py --shape tiny --adapters 1,4 --concurrency 1,2 --new-tokens 8 \
        --prompt-tokens 32 --repeats 1 --out /tmp/multi_lora_smoke.json      # CPU smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

import peft
import psutil
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

SHAPES = {
    "tiny": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                 intermediate_size=688, vocab_size=32000, max_position_embeddings=2048),
    "llama-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
                     max_position_embeddings=8192, rms_norm_eps=1e-5),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPE = torch.bfloat16 if CUDA else torch.float32
PAD = 0
sync = torch.cuda.synchronize if CUDA else (lambda: None)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]


def git(*cmd: str) -> str | None:
    try:
        r = subprocess.run(["git", *cmd], cwd=Path(__file__).resolve().parent, capture_output=True,
                           text=True, timeout=10)
        return r.stdout if r.returncode == 0 else None
    except Exception:  # git missing, not a repository, ...
        return None


def free() -> None:
    gc.collect()
    sync()
    torch.cuda.empty_cache() if CUDA else None


def build_base(shape: str, seed: int) -> torch.nn.Module:
    cfg = LlamaConfig(**SHAPES[shape], pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=DTYPE)
    model.generation_config.pad_token_id = PAD
    return model.eval()


def add_lora(model: torch.nn.Module, name: str, rank: int, seed: int) -> PeftModel:
    """Add adapter ``name``; lora_A from PEFT's init (seeded), lora_B ~ N(0, 0.01) so it is not a no-op."""
    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS, lora_dropout=0.0,
                     task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    if isinstance(model, PeftModel):
        model.add_adapter(name, cfg)
    else:
        model = get_peft_model(model, cfg, adapter_name=name)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if f".{name}." not in pname or "lora_" not in pname:
                continue
            if "lora_B" in pname:
                p.data = (torch.randn(p.shape, generator=gen) * 0.01).to(DEVICE, DTYPE)
            else:  # keep adapters in the serving dtype (PEFT may upcast them to fp32)
                p.data = p.data.to(DEVICE, DTYPE)
    return model.eval()


def merged_model(shape: str, seed: int, rank: int, adapter_seed: int) -> torch.nn.Module:
    model = add_lora(build_base(shape, seed), "a0", rank, adapter_seed).merge_and_unload()
    model.generation_config.pad_token_id = PAD
    return model.eval()


def param_bytes(model: torch.nn.Module, adapter: str | None = None) -> int:
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if adapter is None or (f".{adapter}." in n and "lora_" in n))


def timed(run, repeats: int) -> tuple[float, float]:
    """(median wall seconds, peak memory bytes) over ``repeats`` calls after one warm-up."""
    free()
    if CUDA:
        torch.cuda.reset_peak_memory_stats()
    run()  # warm-up
    walls = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        walls.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if CUDA else psutil.Process().memory_info().rss
    return statistics.median(walls), peak


def gen_fn(model, ids: torch.Tensor, new_tokens: int, **extra):
    def run():
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=False, pad_token_id=PAD, **extra)
        assert out.shape[1] == ids.shape[1] + new_tokens, out.shape
    return run


def record(rows: list, cond: str, n: int, c: int, args, run=None, error: str | None = None,
           skipped: str | None = None) -> None:
    row = {"condition": cond, "adapters": n, "concurrency": c, "tokens_per_s": None, "p50_latency_s": None,
           "peak_memory_bytes": None, "error": error, "skipped": skipped}
    if run is not None and error is None and skipped is None:
        try:
            wall, peak = timed(run, args.repeats)
            row.update(tokens_per_s=c * args.new_tokens / wall, p50_latency_s=wall, peak_memory_bytes=peak)
        except Exception as exc:
            row["error"] = one_line(exc)
    rows.append(row)
    tag = row["error"] or row["skipped"] or f"{row['tokens_per_s']:.1f} tok/s"
    print(f"  {cond:<14} c={c:<3} {tag}", flush=True)


def record_missing(rows: list, cond: str, n: int, conc: list[int], args, error: str) -> None:
    """Record ``error`` for every concurrency of ``cond`` that has no row yet."""
    done = {r["concurrency"] for r in rows if r["condition"] == cond}
    for c in conc:
        if c not in done:
            record(rows, cond, n, c, args, error=error)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--adapters", type=ints, default=[1, 4, 16])
    ap.add_argument("--concurrency", type=ints, default=[1, 4])
    for flag, default in [("--rank", 16), ("--prompt-tokens", 128), ("--new-tokens", 32), ("--repeats", 3),
                          ("--seed", 0), ("--skip-per-adapter-copies-above", 4)]:
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--out", default="bench/results/multi_lora.json")
    args = ap.parse_args()
    adapters, conc = sorted(set(args.adapters)), sorted(set(args.concurrency))
    aseed = lambda i: args.seed + 1 + i  # noqa: E731  adapter i is identical in every condition
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation chatter between peft/transformers
    gen = torch.Generator().manual_seed(args.seed)
    all_ids = torch.randint(3, SHAPES[args.shape]["vocab_size"], (max(conc), args.prompt_tokens),
                            generator=gen).to(DEVICE)
    device_name = torch.cuda.get_device_name(0) if CUDA else f"cpu ({platform.processor() or platform.machine()})"
    print(f"device={device_name} dtype={DTYPE} shape={args.shape} adapters={adapters} concurrency={conc}")
    rows: list[dict] = []
    sizes = {"base_param_bytes": None, "adapter_param_bytes": None}

    # 1. merged: base + adapter a0 merged in.
    model = None
    try:
        model = merged_model(args.shape, args.seed, args.rank, aseed(0))
        sizes["base_param_bytes"] = param_bytes(model)
        for c in conc:
            record(rows, "merged", 1, c, args, gen_fn(model, all_ids[:c], args.new_tokens))
    except Exception as exc:  # e.g. OOM while building
        record_missing(rows, "merged", 1, conc, args, one_line(exc))
    del model
    free()

    # 2. multi_lora_N: one base, adapters added incrementally so N adapters are resident for row N.
    model, loaded = None, 0
    try:
        model = build_base(args.shape, args.seed)
        sizes["base_param_bytes"] = param_bytes(model)
        for n in adapters:
            try:
                while loaded < n:
                    model = add_lora(model, f"a{loaded}", args.rank, aseed(loaded))
                    loaded += 1
                sizes["adapter_param_bytes"] = param_bytes(model, "a0")
            except Exception as exc:
                for n2 in (a for a in adapters if a >= n):  # later N cannot be built either
                    record_missing(rows, f"multi_lora_{n2}", n2, conc, args, one_line(exc))
                break
            for c in conc:
                names = [f"a{j % n}" for j in range(c)]
                record(rows, f"multi_lora_{n}", n, c, args,
                       gen_fn(model, all_ids[:c], args.new_tokens, adapter_names=names))
    except Exception as exc:
        for n in adapters:
            record_missing(rows, f"multi_lora_{n}", n, conc, args, one_line(exc))
    del model
    free()

    # 3. copies_N: N merged models resident, rows grouped per copy, copies run one at a time.
    for n in adapters:
        if n > args.skip_per_adapter_copies_above:
            why = f"N={n} > --skip-per-adapter-copies-above={args.skip_per_adapter_copies_above} (would not fit)"
            for c in conc:
                record(rows, f"copies_{n}", n, c, args, skipped=why)
            continue
        copies, err = [], None
        try:
            for i in range(n):
                copies.append(merged_model(args.shape, args.seed, args.rank, aseed(i)))
        except Exception as exc:
            err = one_line(exc)
        if err:  # outside the except block, so the traceback no longer pins the half-built copy
            copies.clear()
            free()
            record_missing(rows, f"copies_{n}", n, conc, args, err)
            continue
        for c in conc:
            runs = [gen_fn(copies[k], all_ids[:c][k::n], args.new_tokens) for k in range(min(n, c))]
            record(rows, f"copies_{n}", n, c, args, lambda runs=runs: [r() for r in runs])
        del copies, runs
        free()

    # Goal: multi_lora_N within 10 % of merged throughput, memory <= base + N x adapter (+ merged overhead).
    by = {(r["condition"], r["concurrency"]): r for r in rows}
    base_b, ad_b = sizes["base_param_bytes"], sizes["adapter_param_bytes"]
    goals = []
    for c in conc:
        m = by.get(("merged", c), {})
        for n in adapters:
            r = by.get((f"multi_lora_{n}", c), {})
            g = {"adapters": n, "concurrency": c, "throughput_vs_merged": None, "memory_over_budget": None,
                 "verdict": "n/a (missing measurement)"}
            if m.get("tokens_per_s") and r.get("tokens_per_s") and base_b and ad_b:
                budget = base_b + n * ad_b + (m["peak_memory_bytes"] - base_b)
                g["throughput_vs_merged"] = r["tokens_per_s"] / m["tokens_per_s"]
                g["memory_over_budget"] = r["peak_memory_bytes"] / budget
                ok = g["throughput_vs_merged"] >= 0.9 and g["memory_over_budget"] <= 1.0
                g["verdict"] = "PASS" if ok else "FAIL"
            goals.append(g)

    status = git("status", "--porcelain")
    result = {
        "benchmark": "multi_lora", "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": sys.argv, "settings": vars(args) | {"adapters": adapters, "concurrency": conc},
        "seeds": {"model": args.seed, "prompt": args.seed, "adapter_i": "seed + 1 + i"},
        "shape": {"name": args.shape, **SHAPES[args.shape]}, "device": device_name, "dtype": str(DTYPE),
        "memory_kind": "cuda_max_memory_allocated" if CUDA else "cpu_process_rss_after_run",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "peft": peft.__version__},
        "git_commit": (git("rev-parse", "HEAD") or "").strip() or None,
        "dirty": None if status is None else bool(status.strip()),
        **sizes, "rows": rows, "goal": goals,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(result, fh, indent=2)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600
    os.replace(tmp, out)

    fmt = lambda v, spec: format(v, spec) if v else "-"  # noqa: E731
    mib = lambda b, spec=",.0f": fmt(b and b / 2**20, spec)  # noqa: E731
    print(f"\n{device_name} | {DTYPE} | {args.shape} | base {mib(base_b, ',.1f')} MiB | adapter"
          f" {mib(ad_b, ',.1f')} MiB | memory = {result['memory_kind']}")
    print(f"{'condition':<15}{'c':>3}{'tok/s':>10}{'p50 s':>9}{'peak MiB':>11}  note")
    for r in rows:
        print(f"{r['condition']:<15}{r['concurrency']:>3}{fmt(r['tokens_per_s'], '.1f'):>10}"
              f"{fmt(r['p50_latency_s'], '.3f'):>9}{mib(r['peak_memory_bytes']):>11}  "
              f"{(r['error'] or r['skipped'] or '')[:60]}")
    print("goal: tokens/s >= 0.90 x merged and peak <= base + N x adapter + merged overhead")
    for g in goals:
        print(f"  multi_lora_{g['adapters']:<4} c={g['concurrency']:<3} throughput vs merged"
              f" {fmt(g['throughput_vs_merged'], '.2f'):>5}  memory over base+N*adapter"
              f" {fmt(g['memory_over_budget'], '.3f'):>6}  {g['verdict']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
