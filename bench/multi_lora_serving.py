"""Multi-LoRA serving through the real Triton server (CPU): N adapters on ONE loaded base vs one Triton model per
adapter vs a single merged model; memory and throughput (issue 26, item 6).

The engine-level measurement of the same question (PEFT in process, on a lent H200) is `bench/multi_lora.py`;
this one measures the serving path the platform deploys with `triton.multi_lora`: the Python model in its
shared-base mode (`lora__<base>`, adapter chosen per request by ADAPTER, `lora_cache.py`), requests over gRPC
streaming through `TritonClient`, dynamic batching on, `triton.threads` 1 per instance (the measured default).

Arms, for N in --adapters and c in --concurrency (request j of a block uses adapter j % N):
* `shared`   one model, the SmolLM2-135M base with N adapters cached (max_adapters = the largest N);
* `copies`   N Triton models, each the base with its adapter merged (one stub process and one copy of the
             base each: what `triton.multi_lora: false` deploys);
* `merged`   one Triton model, adapter 0 merged, taking every request (the single-adapter ceiling).
Each round runs one block of --requests on every arm, the arms' order rotating between rounds; the paired
ratio of tokens/s to `merged` is per round, with a 95 % t-interval over the rounds. Memory: each Triton model
is its own stub process; its PSS (psutil) after loading, and the shared one's as its cache fills to 1, 4, 16
adapters, against the bound base + N x adapter (base: the shared stub before any adapter; adapter: the size of
its weights file).

Prompts: the public WebShop instructions (data nobody here wrote) as the user turn, one short system turn.
Adapters: `pipelines.bench.adapters` (rank 16, every projection, random non-zero weights: a trained adapter's
shape and cost). Every request is recorded, errors included.

Triton's own counters per block (`TritonClient.statistics`): the batches the dynamic batcher formed (executions
by batch size) and the compute per execution, so a gap between arms can be told apart: other batches, or the
same batches costing more.

Usage: .venv/bin/python bench/multi_lora_serving.py [--work /tmp/w/mlora] [--rounds 4] [--requests 8]
       [--arms shared,merged] (merged, the reference, always runs)
Writes bench/results/multi_lora_serving.json and .html, prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from real_data import commit  # noqa: E402

WEBSHOP = (
    Path(os.environ.get("FLYWHEEL_SHARED", REPO.parent / "shared"))
    / "data"
    / "webshop"
    / "instruction_to_query.dev.json"
)
BASE_MODEL = "smollm2-135m-instruct"
SYSTEM = "You turn a shopper's request into one product search tool call."


def _pss(pid: int) -> int:
    import psutil

    info = psutil.Process(pid).memory_full_info()
    return int(getattr(info, "pss", info.rss))


def _stubs(server_pid: int) -> dict[str, int]:
    """Triton model name -> its Python stub process (the stub's command line names the model's folder)."""
    import psutil

    found = {}
    for child in psutil.Process(server_pid).children(recursive=True):
        try:
            line = " ".join(child.cmdline())
        except psutil.Error:
            continue
        hit = re.search(r"/([a-z0-9_]+)/1/model\.py", line)
        if hit:
            found[hit.group(1)] = child.pid
    return found


def _t95(values: list[float]) -> tuple[float | None, float | None, float | None]:
    """Mean and 95 % t-interval; None where the rounds cannot give one (JSON has no NaN)."""
    from scipy import stats

    if not values:
        return None, None, None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def _counters(client: Any, models: set[str]) -> dict[str, Any]:
    """Triton's counters summed over the arm's models (`TritonClient.statistics`)."""
    total: dict[str, Any] = {"executions_by_batch_size": {}}
    for model in models:
        for key, value in client.statistics(model).items():
            if key == "executions_by_batch_size":
                for size, count in value.items():
                    total[key][size] = total[key].get(size, 0) + count
            else:
                total[key] = total.get(key, 0) + value
    return total


def _served(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What Triton did for one block: how the dynamic batcher formed its batches and where the time went."""
    d = {k: after[k] - before[k] for k in after if k != "executions_by_batch_size"}
    sizes = {
        size: after["executions_by_batch_size"].get(size, 0) - before["executions_by_batch_size"].get(size, 0)
        for size in after["executions_by_batch_size"]
    }
    executions = d["execution_count"] or 1
    return {
        "inferences": d["inference_count"],
        "executions": d["execution_count"],
        "mean_batch": round(d["inference_count"] / executions, 3),
        "executions_by_batch_size": {str(k): v for k, v in sorted(sizes.items()) if v},
        "compute_ms_per_execution": round(d["execution_ns"] / executions / 1e6, 2),
        "queue_ms_per_inference": round(d["queue_ns"] / max(d["inference_count"], 1) / 1e6, 2),
    }


def _block(client: Any, names: list[str], prompts: list[list[dict[str, str]]], concurrency: int) -> dict[str, Any]:
    models = {n.split("@", 1)[0] for n in names}
    before = _counters(client, models)
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(lambda pair: client.infer_one(pair[0], pair[1]), zip(names, prompts)))
    wall = time.perf_counter() - started
    tokens = sum(r.output_tokens for r in replies if r.error is None)
    after = _counters(client, models)  # Triton counts an execution when it returns, after its answers went out:
    waited = time.monotonic() + 5  # wait (5 s at most) for the block's last execution to be counted in this block
    while after["inference_count"] - before["inference_count"] < len(names) and time.monotonic() < waited:
        time.sleep(0.05)
        after = _counters(client, models)
    return {
        "wall_s": round(wall, 3),
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(replies) / wall,
        "errors": sum(r.error is not None for r in replies),
        "triton": _served(before, after),
        "requests": [
            {"model": n, "latency_ms": round(r.latency_ms, 1), "output_tokens": r.output_tokens, "error": r.error}
            for n, r in zip(names, replies)
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="/tmp/w/mlora")
    ap.add_argument("--adapters", default="1,4,16")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=8, help="requests per block (one block per arm per round)")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="shared,copies,merged", help="which arms (merged always: the reference)")
    ap.add_argument(
        "--adapter-scale",
        type=float,
        default=1.0,
        help="the adapters' LoRA B weights times this: "
        "small (0.01) leaves every adapter's greedy answers as the base's, so the arms do equal work "
        "(the same answer lengths) at the same cost per token",
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "multi_lora_serving.json"))
    args = ap.parse_args()
    counts = [int(x) for x in args.adapters.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    top = max(counts)
    unknown = set(args.arms.split(",")) - {"shared", "copies", "merged"}
    if unknown:
        raise SystemExit(f"error: --arms: unknown {sorted(unknown)}; choose from shared, copies, merged")
    arm_names = [a for a in ("shared", "copies", "merged") if a in {*args.arms.split(","), "merged"}]
    n_copies = top if "copies" in arm_names else 1  # merged is copy 0

    from pipelines import services
    from pipelines.base_models import prepare_base
    from pipelines.bench.adapters import make_adapters
    from pipelines.config import load_settings
    from pipelines.serve import repository, shared_base
    from pipelines.serve.client import TritonClient
    from pipelines.services import free_port
    from pipelines.stack import triton as server

    code = commit()  # the code measured: the model folders are built from it now, at the start
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    settings = load_settings(
        root=str(work),
        triton={
            "http_port": free_port(),
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "multi_lora": True,
            "max_adapters": top,
            "max_new_tokens": args.new_tokens,
            "max_input_tokens": 512,
            "threads": 1,
        },
    )
    base = prepare_base(BASE_MODEL, settings)
    names = [f"bench_a{i:02d}" for i in range(top)]
    print(f"writing {top} adapters (rank 16, every projection) of {BASE_MODEL} ...", flush=True)
    folders = make_adapters(base, work / "adapters", names, rank=16, alpha=32, seed=args.seed, scale=args.adapter_scale)
    adapter_bytes = statistics.fmean((folders[n] / "adapter_model.safetensors").stat().st_size for n in names)
    shared = shared_base.build_shared(settings, BASE_MODEL, is_loaded=lambda _: False)
    for name in names:
        shared_base.write_adapter(
            settings,
            name,
            str(folders[name]),
            {"shared": shared.name, "prompt_style": "short", "base_model": BASE_MODEL},
        )
    limits = (512, args.new_tokens)
    copies = [f"bench_copy_{i:02d}" for i in range(n_copies)]
    for name, copy in zip(names, copies):
        repository.write_model(
            settings,
            repository.staging_repository(settings),
            copy,
            base,
            str(folders[name]),
            {"registry_version": None, "base_model": BASE_MODEL, "prompt_style": "short", "model": copy},
            limits=limits,
        )

    instructions = list(json.loads(WEBSHOP.read_text()))
    prompts = [
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        for text in instructions[args.seed * 1000 :]
    ]
    status = server.up(settings)
    client = TritonClient(settings, "grpc", timeout_s=300)
    memory: dict[str, Any] = {"adapter_file_bytes": adapter_bytes}
    try:
        started = time.perf_counter()
        client.load(shared.name)
        print(f"shared base loaded in {time.perf_counter() - started:.1f} s", flush=True)
        client.infer_one(shared.name, prompts[0])  # the base answers, no adapter yet
        stubs = _stubs(status.pid)
        memory["shared_base_only_pss"] = _pss(stubs[shared.name])
        memory["shared_by_adapters"] = {}
        cached = 0
        for n in counts:
            for name in names[cached:n]:
                reply = client.infer_one(f"{shared.name}@{name}", prompts[1])
                if reply.error:
                    raise SystemExit(f"error: {name} did not answer on the shared base: {reply.error}")
            cached = n
            pss = _pss(stubs[shared.name])
            bound = memory["shared_base_only_pss"] + n * adapter_bytes
            memory["shared_by_adapters"][str(n)] = {"pss": pss, "bound": bound, "within": bool(pss <= bound)}
            print(
                f"shared base with {n} adapters: {pss / 2**20:.0f} MiB (bound base + N x adapter "
                f"{bound / 2**20:.0f} MiB)",
                flush=True,
            )
        started = time.perf_counter()
        for copy in copies:
            client.load(copy)
            client.infer_one(copy, prompts[0])
        print(f"{len(copies)} merged copies loaded in {time.perf_counter() - started:.1f} s", flush=True)
        stubs = _stubs(status.pid)
        memory["copy_pss"] = {copy: _pss(stubs[copy]) for copy in copies}
        if "copies" in arm_names:
            memory["copies_by_adapters"] = {str(n): sum(memory["copy_pss"][c] for c in copies[:n]) for n in counts}
        memory["merged_pss"] = memory["copy_pss"][copies[0]]
        memory["server_pss"] = _pss(status.pid)

        rows = []
        cursor = 2
        for n in counts:
            for c in levels:
                every = {
                    "shared": lambda j: f"{shared.name}@{names[j % n]}",
                    "copies": lambda j: copies[j % n],
                    "merged": lambda j: copies[0],
                }
                arms = {arm: [every[arm](j) for j in range(args.requests)] for arm in arm_names}
                order = list(arms)
                for r in range(args.rounds):
                    batch = prompts[cursor : cursor + args.requests]
                    cursor += args.requests
                    for arm in order[r % len(order) :] + order[: r % len(order)]:
                        result = _block(client, arms[arm], batch, c)
                        rows.append({"adapters": n, "concurrency": c, "round": r, "arm": arm, **result})
                        served = result["triton"]
                        print(
                            f"N={n:2d} c={c} round {r} {arm:7s} {result['tokens_per_s']:6.1f} tokens/s "
                            f"{result['requests_per_s']:.2f} req/s errors {result['errors']} | batches "
                            f"{served['executions_by_batch_size']} {served['compute_ms_per_execution']} ms each, "
                            f"queue {served['queue_ms_per_inference']} ms",
                            flush=True,
                        )
        log = services.log_path(str(settings.root), server.SERVICE).read_text(errors="replace")
        loads = [float(x) for x in re.findall(r"adapter \w+ loaded in (\d+) ms", log)]
    finally:
        client.close()
        server.down(settings)

    summary = []
    for n in counts:
        for c in levels:
            cell = [row for row in rows if row["adapters"] == n and row["concurrency"] == c]
            by = {arm: {row["round"]: row for row in cell if row["arm"] == arm} for arm in arm_names}
            entry: dict[str, Any] = {
                "adapters": n,
                "concurrency": c,
                "rounds": args.rounds,
                "requests": sum(len(row["requests"]) for row in cell),
                "errors": sum(row["errors"] for row in cell),
            }
            for arm in by:
                entry[f"{arm}_tokens_per_s"] = round(statistics.median(x["tokens_per_s"] for x in by[arm].values()), 2)
                runs = [x["triton"] for x in by[arm].values()]
                executions = sum(t["executions"] for t in runs) or 1
                answers = [q["output_tokens"] for x in by[arm].values() for q in x["requests"] if not q["error"]]
                entry[f"{arm}_tokens_per_request"] = round(statistics.fmean(answers), 2) if answers else None
                entry[f"{arm}_triton"] = {  # over the cell's rounds: the batches Triton formed and their cost
                    "mean_batch": round(sum(t["inferences"] for t in runs) / executions, 3),
                    "compute_ms_per_execution": round(
                        sum(t["compute_ms_per_execution"] * t["executions"] for t in runs) / executions, 2
                    ),
                }
            for arm in (a for a in ("shared", "copies") if a in by):
                ratios = [
                    by[arm][r]["tokens_per_s"] / by["merged"][r]["tokens_per_s"]
                    for r in range(args.rounds)
                    if by["merged"][r]["tokens_per_s"] > 0
                ]  # a round whose merged block all failed: no ratio
                mean, low, high = _t95(ratios)
                r3 = lambda v: None if v is None else round(v, 3)  # noqa: E731
                entry[f"{arm}_vs_merged"] = {
                    "mean": r3(mean),
                    "ci95": [r3(low), r3(high)],
                    "per_round": [round(x, 3) for x in ratios],
                }
            if "shared" in by:
                low = entry["shared_vs_merged"]["ci95"][0]
                entry["shared_within_10pct_of_merged"] = low is not None and low >= 0.9
            summary.append(entry)
            print(
                f"N={n:2d} c={c}: "
                + ", ".join(
                    f"{arm} {entry[f'{arm}_tokens_per_s']} tokens/s ({entry[f'{arm}_tokens_per_request']} a request; "
                    f"batches of {entry[f'{arm}_triton']['mean_batch']}, "
                    f"{entry[f'{arm}_triton']['compute_ms_per_execution']} ms each)"
                    for arm in by
                )
                + "; "
                + ", ".join(
                    f"{arm}/merged {entry[f'{arm}_vs_merged']['mean']} {entry[f'{arm}_vs_merged']['ci95']}"
                    for arm in ("shared", "copies")
                    if arm in by
                ),
                flush=True,
            )
    result = {
        "benchmark": "multi_lora_serving",
        "utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": code["sha"],
        "dirty": code["dirty"],
        "argv": sys.argv,
        "settings": vars(args),
        "seeds": {
            "adapters": f"{args.seed} * 1000 + i",
            "prompts": f"WebShop dev instructions from {args.seed * 1000}",
        },
        "machine": "2 cores, no GPU (this project's CPU machine)",
        "base_model": BASE_MODEL,
        "triton": {
            "threads": 1,
            "instances": 1,
            "max_batch_size": settings.triton.max_batch_size,
            "queue_delay_us": settings.triton.queue_delay_us,
            "max_adapters": top,
        },
        "memory": memory,
        "adapter_load_ms": loads,
        "summary": summary,
        "rows": rows,
    }
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1))
    _html(result, out.with_suffix(".html"))
    print(f"wrote {out} and {out.with_suffix('.html')}")


def _html(result: dict[str, Any], path: Path) -> None:
    from pipelines.reports import figure_html, new_figure, page, table_html

    fig, (left, right) = new_figure(10, 3.5, ncols=2)
    for arm, style in (("shared", "o-"), ("copies", "s--"), ("merged", "^:")):
        if f"{arm}_tokens_per_s" not in result["summary"][0]:
            continue
        for c in sorted({s["concurrency"] for s in result["summary"]}):
            cells = [s for s in result["summary"] if s["concurrency"] == c]
            left.plot(
                [s["adapters"] for s in cells], [s[f"{arm}_tokens_per_s"] for s in cells], style, label=f"{arm} c={c}"
            )
    left.set_xlabel("adapters"), left.set_ylabel("tokens/s"), left.set_xscale("log", base=2), left.legend(fontsize=7)
    m = result["memory"]
    counts = sorted(int(n) for n in m["shared_by_adapters"])
    right.plot(counts, [m["shared_by_adapters"][str(n)]["pss"] / 2**20 for n in counts], "o-", label="shared (PSS)")
    right.plot(
        counts, [m["shared_by_adapters"][str(n)]["bound"] / 2**20 for n in counts], "k:", label="base + N x adapter"
    )
    if "copies_by_adapters" in m:
        right.plot(counts, [m["copies_by_adapters"][str(n)] / 2**20 for n in counts], "s--", label="copies (PSS)")
    right.set_xlabel("adapters"), right.set_ylabel("MiB"), right.set_xscale("log", base=2), right.legend(fontsize=7)
    rows = [dict(s) for s in result["summary"]]
    path.write_text(
        page(
            "Multi-LoRA serving on one base (CPU, Triton)",
            [
                ("Throughput and memory", figure_html(fig, "tokens/s and memory by adapters")),
                ("Per cell (paired ratios to merged, 95 % t-interval over rounds)", table_html(rows)),
            ],
            subtitle=f"commit {result['commit']}{' (dirty)' if result['dirty'] else ''}, {result['utc']}",
        )
    )


if __name__ == "__main__":
    main()
