"""Multi-LoRA serving benchmark: N adapters on ONE base model (batched slots, or PEFT's mixed batch) against one
merged model and against one merged copy per adapter, in paired rounds.

Greedy decoding (`generate`, exactly --new-tokens per request, random prompt ids, random weights built from a
config: no downloads, no tokenizer). Conditions, all resident at once and measured round by round in a rotating
order (so each round pairs every condition with `merged` under the same machine state):

* `merged`      adapter a0 merged into the base: the single-adapter ceiling.
* `batched_N`   one base + N adapters in slots (`pipelines/triton_backend/batched_lora.py`); row j of a batch of c uses
                adapter j % N: two batched products per adapted projection for any mix.
* `peft_N`      one base + N PEFT adapters, PEFT's mixed-batch forward (`adapter_names`), for N in --peft.
* `copies_N`    N merged models, rows grouped by copy, copies run one after another, for N in --copies.
* with --graphs, `merged_graph` and `batched_N_graph`: the same models through HF's static cache, which
  compiles the decoding step (torch.compile, CUDA graphs on a GPU): launch overhead out of both sides.

Per condition and concurrency: every call's wall time (a call = one batch of c requests), tokens/s, and per
round the ratio to `merged` (or `merged_graph`) of the same round: mean with a paired 95 % t-interval over the
rounds. Before timing, batched rows are checked against PEFT (mixed batch) and against the merged model
(relative Frobenius error of the last logits; `agreement_ok` when under a quarter of the adapter's own effect).
Memory (CUDA): per N, a fresh base with N slots, peak allocated over a
c-row run, against base + N x adapter (weights) and against that plus merged's own working memory. Errors
(OOM, compile failures) are recorded in their row and the run goes on; --deadline-s stops starting new rounds.

Needs torch, transformers, peft, numpy-free; the models are built by `multi_lora_models.py` (beside this file), which
imports `batched_lora.py` by path. CUDA bf16 when there, else CPU fp32:
    python3 bench/multi_lora.py --shape llama-8b --adapters 1,4,16 --concurrency 1,4 --graphs --out $OUT/multi_lora.json
    .venv/bin/python bench/multi_lora.py --shape tiny --rounds 2 --new-tokens 4 --prompt-tokens 16 --out /tmp/ml.json
    OMP_NUM_THREADS=1 .venv/bin/python bench/multi_lora.py --shape smollm2-135m --adapters 4 --concurrency 4 \
        --peft '' --copies '' --new-tokens 16 --prompt-tokens 64 --out /tmp/ml_smollm2.json
    # (above: this CPU's model, engine only)
    OMP_NUM_THREADS=1 .venv/bin/python bench/multi_lora.py --shape llama-1b ...  # adapters 0.9 % of the base, not 3.6 %
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from datetime import UTC, datetime
from pathlib import Path

import torch
import transformers
from multi_lora_models import (
    BATCHED_LORA,
    CUDA,
    DEVICE,
    DTYPE,
    SHAPES,
    TARGETS,
    adapter_state,
    batched_lora,
    build_base,
    free,
    generate,
    last_logits,
    merged_model,
    peft_model,
    rel,
    sync,
)

HERE = Path(__file__).resolve().parent
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def ints(text: str) -> list[int]:
    return sorted({int(x) for x in text.split(",") if x.strip()})


def one_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]


def git(*cmd: str) -> str | None:
    try:
        r = subprocess.run(["git", *cmd], cwd=HERE, capture_output=True, text=True, timeout=10)
        return r.stdout if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def interval(ratios: list[float]) -> dict:
    """Mean of the per-round ratios with a 95 % t-interval (n = rounds)."""
    n = len(ratios)
    if n == 0:
        return {"n": 0, "mean": None, "low": None, "high": None}
    mean = statistics.fmean(ratios)
    if n < 2:
        return {"n": n, "mean": mean, "low": None, "high": None}
    t = T975[max(k for k in T975 if k <= n - 1)]
    half = t * statistics.stdev(ratios) / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def write(result: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(result, fh, indent=2)
    os.chmod(tmp, 0o644)
    os.replace(tmp, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--adapters", type=ints, default=[1, 4, 16])
    ap.add_argument("--concurrency", type=ints, default=[1, 4])
    ap.add_argument("--peft", type=ints, default=[4], help="N for the PEFT mixed-batch reference ('' for none)")
    ap.add_argument("--copies", type=ints, default=[4], help="N for one merged copy per adapter ('' for none)")
    ap.add_argument("--graphs", action="store_true", help="also the compiled static-cache decoding (CUDA graphs)")
    for flag, default in [
        ("--rank", 16),
        ("--prompt-tokens", 128),
        ("--new-tokens", 32),
        ("--rounds", 5),
        ("--seed", 0),
        ("--deadline-s", 0),
    ]:
        ap.add_argument(flag, type=int, default=default)
    ap.add_argument("--out", default="bench/results/multi_lora.json")
    args = ap.parse_args()
    started = time.monotonic()
    late = lambda: args.deadline_s and time.monotonic() - started > args.deadline_s  # noqa: E731
    transformers.logging.set_verbosity_error()
    torch._dynamo.config.cache_size_limit = 32  # a graph per (batch size, adapter mode)
    warnings.filterwarnings("ignore")
    device_name = torch.cuda.get_device_name(0) if CUDA else f"cpu ({platform.machine()})"
    adapters, conc, scale = args.adapters, args.concurrency, 2.0  # lora_alpha = 2 x rank
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, SHAPES[args.shape]["vocab_size"], (max(conc), args.prompt_tokens), generator=gen).to(DEVICE)
    status = git("status", "--porcelain")
    result = {
        "benchmark": "multi_lora",
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "settings": vars(args),
        "device": device_name,
        "dtype": str(DTYPE),
        "seeds": {"model": args.seed, "prompt": args.seed, "adapter_i": "seed + 1 + i"},
        "shape": {"name": args.shape, **SHAPES[args.shape]},
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "commit": (git("rev-parse", "HEAD") or "").strip() or None,
        "sha256": {
            f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in (Path(__file__).resolve(), HERE / "multi_lora_models.py", BATCHED_LORA)
        },
        "dirty": None if status is None else bool(status.strip()),
        "calls": [],
        "errors": {},
    }
    out = Path(args.out)
    print(f"device={device_name} dtype={DTYPE} shape={args.shape} adapters={adapters} concurrency={conc}", flush=True)

    base = build_base(args.shape, args.seed)
    states = [adapter_state(base, args.rank, args.seed + 1 + i) for i in range(max(adapters + args.peft + args.copies))]
    del base
    free()
    # Memory first: per N a fresh base with N slots (nothing else resident), peak over a run at the largest c.
    memory = []
    if CUDA:
        c = max(conc)
        for n in adapters:
            row = {"adapters": n, "concurrency": c}
            try:
                model = build_base(args.shape, args.seed)
                base_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
                slots = batched_lora.BatchedLoRA(model, TARGETS, slots=n, rank=args.rank)
                for i in range(n):
                    slots.load(i, states[i], scale)
                slots.select([j % n for j in range(c)])
                torch.cuda.reset_peak_memory_stats()
                generate(model, ids[:c], args, False)
                row["peak_bytes"] = torch.cuda.max_memory_allocated()
                row["weights_budget_bytes"] = base_bytes + n * slots.adapter_bytes()
                row["peak_over_weights_budget"] = row["peak_bytes"] / row["weights_budget_bytes"]
            except Exception as exc:  # noqa: BLE001
                row["error"] = one_line(exc)
            model = slots = None  # freed before the next N's peak, on an error too
            free()
            memory.append(row)
        try:
            model = merged_model(args, states[0], scale)
            torch.cuda.reset_peak_memory_stats()
            generate(model, ids[:c], args, False)
            memory.append({"condition": "merged", "concurrency": c, "peak_bytes": torch.cuda.max_memory_allocated()})
            del model
        except Exception as exc:  # noqa: BLE001
            memory.append({"condition": "merged", "error": one_line(exc)})
        free()
    result["memory"] = memory
    write(result, out)
    print(f"  memory measured ({time.monotonic() - started:.0f} s)", flush=True)
    base = build_base(args.shape, args.seed)
    batched = batched_lora.BatchedLoRA(base, TARGETS, slots=max(adapters), rank=args.rank)
    for i in range(max(adapters)):
        batched.load(i, states[i], scale)
    result["base_param_bytes"] = sum(p.numel() * p.element_size() for p in base.parameters())
    result["adapter_bytes"] = batched.adapter_bytes()
    models = {"merged": merged_model(args, states[0], scale)}
    runs = {}  # condition -> (model, c -> callable)

    def on_batched(n: int, graph: bool):
        def run(c: int):
            batched.select([j % n for j in range(c)])
            generate(base, ids[:c], args, graph)

        return run

    runs["merged"] = lambda c: generate(models["merged"], ids[:c], args, False)
    for n in adapters:
        runs[f"batched_{n}"] = on_batched(n, False)
    for n in args.peft:
        try:
            models[f"peft_{n}"] = peft_model(args, states[:n])
            runs[f"peft_{n}"] = (
                lambda m, n: lambda c: generate(m, ids[:c], args, False, adapter_names=[f"a{j % n}" for j in range(c)])
            )(models[f"peft_{n}"], n)
        except Exception as exc:  # noqa: BLE001 (OOM: recorded, the others go on)
            result["errors"][f"peft_{n}"] = one_line(exc)
    for n in args.copies:
        try:
            copies = [merged_model(args, states[i], scale) for i in range(n)]
            runs[f"copies_{n}"] = (
                lambda cs: (
                    lambda c: [generate(cs[k], ids[:c][k :: len(cs)], args, False) for k in range(min(len(cs), c))]
                )
            )(copies)
        except Exception as exc:  # noqa: BLE001
            result["errors"][f"copies_{n}"] = one_line(exc)
            copies = None
            free()

    # Agreement before any timing: batched rows against PEFT's mixed batch and against the merged model.
    check = {}
    batched.select([0])
    check["batched_vs_merged_a0"] = rel(last_logits(base, ids[:1]), last_logits(models["merged"], ids[:1]))
    peft_n = next((n for n in args.peft if f"peft_{n}" in models), None)
    if peft_n:
        c = max(conc)
        batched.select([j % peft_n for j in range(c)])
        check[f"batched_vs_peft_{peft_n}_c{c}"] = rel(
            last_logits(base, ids[:c]),
            last_logits(models[f"peft_{peft_n}"], ids[:c], adapter_names=[f"a{j % peft_n}" for j in range(c)]),
        )
    batched.select([])
    check["base_vs_merged"] = rel(last_logits(base, ids[:1]), last_logits(models["merged"], ids[:1]))
    result["agreement_rel_error"] = check  # relative Frobenius error of the last logits over the batch
    bound = 0.25 * check["base_vs_merged"]  # a quarter of what the adapter itself changes
    result["agreement_ok"] = all(v <= bound for k, v in check.items() if k != "base_vs_merged")
    if not result["agreement_ok"]:
        print(f"WARNING: the slots disagree with the reference by more than {bound:.2e}: timings of a wrong engine")
    print("agreement (relative error of last logits):", {k: f"{v:.2e}" for k, v in check.items()}, flush=True)

    if args.graphs:
        runs["merged_graph"] = lambda c: generate(models["merged"], ids[:c], args, True)
        for n in adapters:
            runs[f"batched_{n}_graph"] = on_batched(n, True)

    def call(cond: str, c: int, rnd: int) -> None:
        sync()
        t0 = time.perf_counter()
        error = None
        try:
            runs[cond](c)
            sync()
        except Exception as exc:  # noqa: BLE001
            error = one_line(exc)
        wall = time.perf_counter() - t0
        result["calls"].append(
            {
                "condition": cond,
                "concurrency": c,
                "round": rnd,
                "wall_s": wall,
                "tokens": c * args.new_tokens if error is None else 0,
                "error": error,
            }
        )

    conds = list(runs)
    rounds_done = {}
    for phase in ([c for c in conds if not c.endswith("_graph")], [c for c in conds if c.endswith("_graph")]):
        if not phase:
            continue
        for cond in phase:  # warm-up (round -1; compiles and graph recordings happen here): every call is kept
            if late():
                result["errors"][cond] = "deadline before its warm-up"
                continue
            for c in conc:
                for _ in range(3 if cond.endswith("_graph") else 1):
                    call(cond, c, -1)
            print(f"  warmed {cond} ({time.monotonic() - started:.0f} s)", flush=True)
            write(result, out)
        done = 0
        for rnd in range(args.rounds):
            if late():
                print(f"deadline: {done} rounds of {phase[0]}'s phase", flush=True)
                break
            shift = rnd % len(phase)
            for cond in phase[shift:] + phase[:shift]:
                for c in conc:
                    call(cond, c, rnd)
            done += 1
            print(f"  round {rnd} ({time.monotonic() - started:.0f} s)", flush=True)
            write(result, out)
        rounds_done[phase[0]] = done
    result["rounds_done"] = rounds_done

    # Summary: tokens/s per condition and c (median over rounds), ratio to the reference of its phase.
    summary = []
    timed = [k for k in result["calls"] if k["round"] >= 0]
    pairs_to = [(cond, "merged_graph" if cond.endswith("_graph") else "merged") for cond in conds]
    pairs_to += [(f"batched_{n}", f"peft_{n}") for n in args.peft if f"peft_{n}" in conds and n in adapters]
    for cond, ref in pairs_to:
        for c in conc:
            mine = {k["round"]: k for k in timed if k["condition"] == cond and k["concurrency"] == c}
            refs = {k["round"]: k for k in timed if k["condition"] == ref and k["concurrency"] == c}
            ok = [k for k in mine.values() if not k["error"]]
            ratios = [
                (mine[r]["tokens"] / mine[r]["wall_s"]) / (refs[r]["tokens"] / refs[r]["wall_s"])
                for r in mine
                if r in refs and not mine[r]["error"] and not refs[r]["error"]
            ]
            n = next((int(part) for part in cond.split("_") if part.isdigit()), 1)
            summary.append(
                {
                    "condition": cond,
                    "concurrency": c,
                    "reference": ref,
                    "calls": len(mine),
                    "distinct_adapters_per_batch": min(n, c),
                    "failed_requests": c * (len(mine) - len(ok)),
                    "failed_warmup_requests": c
                    * sum(
                        1
                        for k in result["calls"]
                        if k["round"] < 0 and k["condition"] == cond and k["concurrency"] == c and k["error"]
                    ),
                    "skipped": result["errors"].get(cond),
                    "tokens_per_s": statistics.median([k["tokens"] / k["wall_s"] for k in ok]) if ok else None,
                    "ratio_to_reference": interval(ratios),
                }
            )
    graph_vs_eager = []  # the two phases run minutes apart: a ratio of medians, no interval
    for c in conc:
        med = {
            cond: [
                k["tokens"] / k["wall_s"]
                for k in timed
                if k["condition"] == cond and k["concurrency"] == c and not k["error"]
            ]
            for cond in ("merged", "merged_graph")
        }
        graph_vs_eager.append(
            {
                "concurrency": c,
                "merged_graph_over_merged_medians": (
                    statistics.median(med["merged_graph"]) / statistics.median(med["merged"])
                    if med["merged"] and med["merged_graph"]
                    else None
                ),
            }
        )
    result["summary"], result["graph_speedup"] = summary, graph_vs_eager
    write(result, out)

    result["memory"] = memory
    result["elapsed_s"] = time.monotonic() - started
    write(result, out)

    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)  # noqa: E731
    print(
        f"\n{device_name} | {DTYPE} | {args.shape} | base {result['base_param_bytes'] / 2**20:,.0f} MiB | adapter "
        f"{result['adapter_bytes'] / 2**20:,.1f} MiB | {rounds_done} rounds per phase | {len(result['calls'])} calls, "
        f"{sum(1 for k in result['calls'] if k['error'])} errors"
    )
    print(f"{'condition':<20}{'c':>3}{'tok/s':>10}  ratio to reference [95 % paired]")
    for s in summary:
        r = s["ratio_to_reference"]
        print(
            f"{s['condition']:<20}{s['concurrency']:>3}{fmt(s['tokens_per_s'], '.1f'):>10}  {fmt(r['mean'])} "
            f"[{fmt(r['low'])}, {fmt(r['high'])}] vs {s['reference']} (n={r['n']}, "
            f"{s['distinct_adapters_per_batch']} adapters a batch, failed requests {s['failed_requests']})"
        )
    for g in graph_vs_eager:
        print(
            f"merged: graphs over eager (ratio of medians, phases apart), c={g['concurrency']}: "
            f"{fmt(g['merged_graph_over_merged_medians'])}x"
        )
    for m in memory:
        print("memory", {k: (f"{v / 2**30:.2f} GiB" if k.endswith("bytes") else v) for k, v in m.items()})
    for cond, err in result["errors"].items():
        print(f"error {cond}: {err}")
    print(f"wrote {out} in {result['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
