"""Multi-LoRA renderers: the engine benchmark (bench/multi_lora.py, no server) and multi-LoRA through Triton
(bench/multi_lora_serving.py). Their ratios come with paired 95 % t-intervals over rounds, as recorded."""

from __future__ import annotations

import re
import statistics
from typing import Any

from docs.generate.md import NO_INTERVAL, Body, columns, gib, interval, ms, num, pair, table, text
from docs.generate.plots import Axes, Series, line
from docs.generate.result import Result

PAIRED = "paired 95 % t-interval over rounds"
BATCHED = re.compile(r"^batched_(\d+)(_graph)?$")


def engine(result: Result) -> Body:
    """Dispatch on the file's generation: `summary` with intervals (the batched slots), or `rows` + `goal`."""
    return engine_summary(result) if isinstance(result.data.get("summary"), list) else engine_rows(result)


def engine_what(d: dict[str, Any], against: str) -> str:
    s = d.get("settings", {})
    return (
        f"Engine throughput (no server) of a {s.get('shape')} base ({d.get('dtype')}, {d.get('device')}) with "
        f"N rank-{s.get('rank')} LoRA adapters against {against}, {s.get('prompt_tokens')} prompt + "
        f"{s.get('new_tokens')} new tokens a request."
    )


def engine_summary(result: Result) -> Body:
    d = result.data
    timed = [r for r in d["summary"] if r["ratio_to_reference"]["n"]]
    untimed = [f"{r['condition']} c={r['concurrency']}" for r in d["summary"] if not r["ratio_to_reference"]["n"]]
    per_batch = any("distinct_adapters_per_batch" in r for r in timed)
    rows = [
        [r["condition"], r["concurrency"]]
        + ([r.get("distinct_adapters_per_batch")] if per_batch else [])
        + [r["ratio_to_reference"]["n"], r.get("errors", r.get("failed_requests")), num(r["tokens_per_s"])]
        + [r["reference"], num(r["ratio_to_reference"]["mean"]), ratio_interval(r["ratio_to_reference"])]
        for r in timed
    ]
    headers = ["condition", "c", *(["adapters a batch"] if per_batch else []), "n (rounds)", "errors", "tokens/s"]
    blocks = [table([*headers, "reference", "ratio to reference", PAIRED], rows)]
    if untimed:
        blocks.append(f"Not timed (n = 0): {', '.join(untimed)}.")
    blocks += [b for b in (engine_plot(result, timed), graphs(d), memory(d), agreement(d), errors(d)) if b]
    return Body(engine_what(d, "one merged model, in paired rounds (rotating order)"), blocks)


def ratio_interval(r: dict[str, Any]) -> str:
    if r["mean"] == 1.0 and r["low"] == r["high"] == 1.0:
        return "(the reference)"
    return interval(r["low"], r["high"])


def engine_plot(result: Result, timed: list[dict[str, Any]]) -> str | None:
    lines: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for r in timed:
        m = BATCHED.match(r["condition"])
        if m:
            key = f"batched{' graph' if m[2] else ''}, c={r['concurrency']}"
            lines.setdefault(key, []).append((int(m[1]), r["ratio_to_reference"]))
    if len({n for pts in lines.values() for n, _ in pts}) < 2:
        return None
    series = []
    for k, pts in lines.items():
        ns, vs = [n for n, _ in pts], [v for _, v in pts]
        series.append(Series(k, ns, [v["mean"] for v in vs], [v["low"] for v in vs], [v["high"] for v in vs]))
    n = sorted({v["n"] for pts in lines.values() for _, v in pts})
    axes = Axes("LoRA adapters resident", "tokens/s, ratio to merged", log=2, reference=1.0)
    title = "Batched adapters against one merged model"
    return line(result, "ratio", title, series, axes, f"n = {', '.join(map(str, n))} paired rounds a point", PAIRED)


def graphs(d: dict[str, Any]) -> str | None:
    rows = []
    for g in d.get("graph_speedup", []):
        r = g.get("merged_graph_over_merged")
        if r and r.get("n"):
            rows.append([g["concurrency"], r["n"], num(r["mean"]), interval(r["low"], r["high"])])
    if not rows:
        return None
    return table(["c", "n (rounds)", "compiled graph / eager, merged", PAIRED], rows)


def memory(d: dict[str, Any]) -> str | None:
    rows = [
        [m.get("adapters", m.get("condition")), m["concurrency"], gib(m["peak_bytes"])]
        + [gib(m.get("weights_budget_bytes")), num(m.get("peak_over_weights_budget"))]
        for m in d.get("memory", [])
    ]
    if not rows:
        return None
    return table(["adapters (or condition)", "c", "peak memory", "weights budget", "peak / budget"], rows)


def agreement(d: dict[str, Any]) -> str | None:
    rel = d.get("agreement_rel_error") or {}
    if not rel:
        return None
    ok = f" (agreement check passed: {num(d['agreement_ok'])})" if "agreement_ok" in d else ""
    head = f"Relative (Frobenius) error of the last logits{ok}:"
    return head + "\n\n" + table(["pair", "relative error"], list(rel.items()))


def errors(d: dict[str, Any]) -> str | None:
    errs = d.get("errors") or {}
    return table(["condition", "error"], list(errs.items())) if errs else None


def engine_rows(result: Result) -> Body:
    d = result.data
    repeats = d.get("settings", {}).get("repeats")
    spec = [
        ("condition", "condition", text),
        ("adapters", "adapters", num),
        ("c", "concurrency", num),
        ("tokens/s", "tokens_per_s", num),
        ("p50 latency ms", "p50_latency_s", lambda x: ms(x * 1000) if x is not None else "n/a"),
        ("peak memory", "peak_memory_bytes", gib),
        ("skipped", "skipped", lambda x: x or ""),
    ]
    goal = table(
        ["adapters", "c", "throughput / merged", "memory / budget", "verdict"],
        [
            [
                g["adapters"],
                g["concurrency"],
                num(g["throughput_vs_merged"]),
                num(g["memory_over_budget"]),
                g["verdict"],
            ]
            for g in d.get("goal", [])
        ],
    )
    measured = [r for r in d["rows"] if r.get("tokens_per_s") is not None]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in measured:
        groups.setdefault(f"{r['condition'].rsplit('_', 1)[0]}, c={r['concurrency']}", []).append(r)
    series = [Series(k, [r["adapters"] for r in v], [r["tokens_per_s"] for r in v]) for k, v in groups.items()]
    plot = line(
        result,
        "throughput",
        "Tokens/s against adapters",
        series,
        Axes("LoRA adapters", "tokens/s", log=2),
        f"n = {repeats} repeats a point",
    )
    blocks = [
        f"Each row: the median of {repeats} repeats (n = {repeats}).",
        columns(d["rows"], spec),
        f"Goal checks, ratios of medians ({NO_INTERVAL}):\n\n{goal}",
        plot,
    ]
    return Body(engine_what(d, "one merged model and one merged copy per adapter (PEFT mixed batches)"), blocks)


def serving_what(d: dict[str, Any]) -> str:
    s, t = d.get("settings", {}), d.get("triton", {})
    return (
        f"Multi-LoRA through Triton ({d.get('base_model')}, {t.get('instances')} instance x {t.get('threads')} "
        f"thread, max batch {t.get('max_batch_size')}): tokens/s of N adapters on one shared base against one merged "
        f"model (arms {s.get('arms', 'shared,copies,merged')}), {s.get('rounds')} paired rounds of "
        f"{s.get('requests')} requests a cell, {s.get('new_tokens')} new tokens."
    )


def serving(result: Result) -> Body:
    d = result.data
    summary = d["summary"]
    arms = [a for a in ("shared", "copies", "merged") if any(f"{a}_tokens_per_s" in r for r in summary)]
    batches = any("shared_triton" in r for r in summary)
    throughput = table(
        ["adapters", "c", "n (requests)", "errors", *(f"{a} tokens/s" for a in arms)]
        + (["mean batch shared / merged"] if batches else []),
        [
            [
                r["adapters"],
                r["concurrency"],
                r["requests"],
                r["errors"],
                *(num(r.get(f"{a}_tokens_per_s")) for a in arms),
            ]
            + ([mean_batches(r)] if batches else [])
            for r in summary
        ],
    )
    ratios = table(
        ["adapters", "c", "n (rounds)", "arm / merged", "mean", PAIRED],
        [
            [
                r["adapters"],
                r["concurrency"],
                len(r[k]["per_round"]),
                k.removesuffix("_vs_merged"),
                num(r[k]["mean"]),
                pair(r[k]["ci95"]),
            ]
            for r in summary
            for k in ("shared_vs_merged", "copies_vs_merged")
            if k in r
        ],
    )
    blocks = [throughput, ratios, serving_plot(result, summary), serving_memory(d)]
    return Body(serving_what(d), [b for b in blocks if b])


def mean_batches(r: dict[str, Any]) -> str:
    return f"{num(r['shared_triton']['mean_batch'])} / {num(r.get('merged_triton', {}).get('mean_batch'))}"


def serving_plot(result: Result, summary: list[dict[str, Any]]) -> str | None:
    series = []
    for arm in ("shared", "copies"):
        for c in sorted({r["concurrency"] for r in summary}):
            rows = [r for r in summary if r["concurrency"] == c and f"{arm}_vs_merged" in r]
            if rows:
                vs = [r[f"{arm}_vs_merged"] for r in rows]
                lows, highs = [v["ci95"][0] for v in vs], [v["ci95"][1] for v in vs]
                xs, means = [r["adapters"] for r in rows], [v["mean"] for v in vs]
                series.append(Series(f"{arm}, c={c}", xs, means, lows, highs))
    if len({r["adapters"] for r in summary}) < 2:
        return None
    rounds = sorted({len(r["shared_vs_merged"]["per_round"]) for r in summary if "shared_vs_merged" in r})
    n = f"n = {', '.join(map(str, rounds))} paired rounds a point"
    axes = Axes("LoRA adapters", "tokens/s, ratio to merged", log=2, reference=1.0)
    return line(result, "ratio", "Adapters against one merged model, through Triton", series, axes, n, PAIRED)


def serving_memory(d: dict[str, Any]) -> str | None:
    m = d.get("memory") or {}
    shared = m.get("shared_by_adapters") or {}
    if not shared:
        return None
    copies = m.get("copies_by_adapters") or {}
    rows = [[n, gib(v["pss"]), gib(v["bound"]), num(v["within"]), gib(copies.get(n))] for n, v in shared.items()]
    load = d.get("adapter_load_ms") or []
    note = f"Adapter load: median {ms(statistics.median(load))} ms (n = {len(load)})." if load else ""
    head = ["adapters", "shared PSS", "bound", "within bound", "one copy per adapter PSS"]
    return f"Memory (PSS), merged model alone {gib(m.get('merged_pss'))}:\n\n{table(head, rows)}\n\n{note}".strip()
