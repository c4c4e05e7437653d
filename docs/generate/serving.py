"""Serving renderers: AIPerf through the gateway, torch threads under load, gateway against Triton direct,
grammar backends, Triton instances and threads, overload."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from docs.generate.md import NO_INTERVAL, Body, Column, columns, interval, ms, num, pct, signed, table, text
from docs.generate.plots import Axes, Series, line
from docs.generate.result import Result

P99_NOTE = "p99 is left out: the docs show a p99 from 100 samples or more, and these runs have fewer."


def by(rows: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by one field, in the file's order."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[str(row.get(key))].append(row)
    return dict(groups)


def curve(
    result: Result, name: str, group: str, y: str, ylabel: str, n: str, rows: list[dict[str, Any]] | None = None
) -> str:
    """One line per `group` value: `y` against concurrency (of the file's runs, or of `rows`)."""
    runs = [r for r in (result.data["runs"] if rows is None else rows) if r.get(y) is not None]
    series = [Series(k, [r["concurrency"] for r in v], [r[y] for r in v]) for k, v in by(runs, group).items()]
    title = f"{ylabel} against concurrency"
    return line(result, name, title, series, Axes("concurrent requests", ylabel), n)


def n_of(runs: list[dict[str, Any]], key: str = "requests") -> str:
    counts = sorted({r.get(key) for r in runs if r.get(key) is not None})
    return f"n = {', '.join(map(str, counts))} requests per point"


STREAMED_RUN: list[Column] = [  # a run of `bench.results.summarize_run` (streamed requests)
    ("c", "concurrency", num),
    ("n", "requests", num),
    ("errors", "errors", num),
    ("p50 ms", "p50_ms", ms),
    ("requests/s", "requests_per_s", num),
    ("output tokens/s", "output_tokens_per_s", num),
    ("TTFT ms", "ttft_ms", ms),
    ("ITL ms", "itl_ms", ms),
    ("exact match", "exact_match", pct),
]

AIPERF_COLUMNS: list[Column] = [
    ("c", "concurrency", num),
    ("n", "requests", num),
    ("errors", "errors", num),
    ("TTFT p50 ms", "ttft_p50_ms", ms),
    ("ITL p50 ms", "itl_p50_ms", ms),
    ("latency p50 ms", "latency_p50_ms", ms),
    ("requests/s", "requests_per_s", num),
    ("prompt tokens p50", "prompt_tokens_p50", num),
    ("output tokens p50", "output_tokens_p50", num),
]


def aiperf(result: Result) -> Body:
    d = result.data
    what = (
        f"AIPerf {d.get('aiperf', '')} profiling through the gateway: time to first token, inter-token latency, "
        f"latency and throughput of the live model ({d.get('live')}) and the base model by concurrency, "
        f"{d.get('requests_per_run')} {'streamed ' if d.get('streaming') else ''}requests a run."
    )
    runs = d["runs"]
    blocks = [
        columns(runs, [("model", "model", text), *AIPERF_COLUMNS]),
        f"Models compared by their medians at each concurrency: {NO_INTERVAL}. {P99_NOTE}",
        curve(result, "latency", "model", "latency_p50_ms", "latency p50 (ms)", n_of(runs)),
        curve(result, "throughput", "model", "requests_per_s", "requests/s", n_of(runs)),
    ]
    return Body(what, blocks)


def threads_under_load(result: Result) -> Body:
    d = result.data
    spec = [("torch threads", "torch_threads", num), ("AIPerf timing", "aiperf", text), *AIPERF_COLUMNS]
    blocks = [columns(d["runs"], spec), f"Settings compared by their medians: {NO_INTERVAL}. {P99_NOTE}"]
    return Body(f"Latency of {d['what']}.", blocks)


def gateway(result: Result) -> Body:
    d = result.data
    what = (
        f"Latency and throughput of the same requests to {d.get('model')} "
        f"({'grammar-constrained' if d.get('constrained') else 'unconstrained'}) sent to Triton directly and "
        f"through the gateway, {d.get('requests')} requests a run, by concurrency."
    )
    spec = [
        ("path", "path", text),
        ("c", "concurrency", num),
        ("n", "requests", num),
        ("errors", "errors", num),
        ("p50 ms", "p50_ms", ms),
        ("p95 ms", "p95_ms", ms),
        ("TTFT p50 ms", "ttft_p50_ms", ms),
        ("tool-name chunk p50 ms", "name_p50_ms", ms),
        ("requests/s", "requests_per_s", num),
    ]
    overhead = (
        f"Gateway over Triton direct at concurrency 1: p50 {signed_ms(d.get('gateway_overhead_p50_ms_c1'))}, "
        f"TTFT p50 {signed_ms(d.get('gateway_ttft_overhead_p50_ms_c1'))} ({NO_INTERVAL})."
    )
    runs = d["runs"]
    return Body(what, [columns(runs, spec), overhead, curve(result, "p50", "path", "p50_ms", "p50 (ms)", n_of(runs))])


def signed_ms(x: Any) -> str:
    return "n/a" if x is None else f"{'+' if x > 0 else ''}{ms(x)} ms"


def grammar(result: Result) -> Body:
    d = result.data
    what = (
        f"Constrained decoding backends against free decoding on {d.get('model')} ({d.get('condition')}, "
        f"{d.get('torch_threads')} torch threads): time per request and per token, and the share of outputs "
        "valid under the tools' schemas."
    )
    ok = [r for r in d["rows"] if "error" not in r]
    spec = [
        ("decoder", "decoder", text),
        ("n", "requests", num),
        ("ms/request", "ms_per_request", ms),
        ("ms/output token", "ms_per_output_token", num),
        ("output tokens (mean)", "output_tokens_mean", num),
        ("schema valid", "schema_valid", pct),
        ("grammar build ms (mean)", "grammar_build_ms_mean", num),
    ]
    blocks = [columns(ok, spec), f"Decoders compared by their means: {NO_INTERVAL}."]
    failed = [(r.get("decoder"), r["error"]) for r in d["rows"] if "error" in r]
    if failed:
        blocks.append(table(["decoder", "not measured: error"], failed))
    return Body(what, blocks)


def triton_threads(result: Result) -> Body:
    d = result.data
    what = (
        f"Triton instances and torch threads for the live model ({d.get('live')}): latency, throughput and "
        f"exact match by concurrency, {d.get('requests')} streamed requests a run."
    )
    spec = [("instances x threads", "model", text), *STREAMED_RUN, ("load s", "load_s", num)]
    runs = d["runs"]
    blocks = [
        columns(runs, spec),
        f"Settings compared by their medians: {NO_INTERVAL}. Threads 0 is torch's default (the cores).",
        curve(result, "p50", "model", "p50_ms", "p50 (ms)", n_of(runs)),
        curve(result, "throughput", "model", "output_tokens_per_s", "output tokens/s", n_of(runs)),
    ]
    return Body(what, blocks)


def overload(result: Result) -> Body:
    d = result.data
    s = d.get("settings", {})
    what = (
        f"The gateway under {s.get('factor')}x its admission limit ({s.get('clients')} clients against "
        f"{s.get('admitted')} admitted, {num(s.get('seconds'))} s): what is answered, what is refused with 429 "
        "and how fast, and whether the health probes stay up."
    )
    n = d.get("requests") or 0
    counts = table(
        ["requests (n)", "answered", "refused 429", "refused share", "other or no response", "answered/s"],
        [
            [
                n,
                d.get("answered"),
                d.get("refused_429"),
                pct(d.get("refused_429", 0) / n if n else None),
                d.get("other_status_or_no_response"),
                d.get("answered_per_s"),
            ]
        ],
    )
    lat = d.get("latency", {})
    outcome_n = {"answered": d.get("answered"), "refused_429": d.get("refused_429")}
    latency = table(
        ["outcome", "n", "p50 ms", "p99 ms", "max ms"],
        [[k, outcome_n.get(k), ms(v.get("p50_ms")), ms(v.get("p99_ms")), ms(v.get("max_ms"))] for k, v in lat.items()],
    )
    probes = table(
        ["probe", "n", "ok", "ready 200", "p50 ms", "p99 ms", "max ms"],
        [
            [
                k,
                v.get("n"),
                v.get("ok"),
                v.get("ready_200"),
                ms(v.get("p50_ms")),
                ms(v.get("p99_ms")),
                ms(v.get("max_ms")),
            ]
            for k, v in d.get("probes", {}).items()
        ],
    )
    return Body(what, [counts, latency, probes])


def serving_precision(result: Result) -> Body:
    """bench/serve_precision.py: the live version at each precision through Triton, paired against fp32."""
    d = result.data
    what = (
        f"The live version ({d.get('live')}, served at {d.get('served_precision')}) at each precision through "
        f"Triton, {d.get('requests')} streamed test-split requests per run, decoded as served; exact match paired "
        "per request against fp32 at the same concurrency."
    )
    runs = [{**r, "precision": _precision_of(r["model"], d.get("served_precision"))} for r in d["runs"]]
    spec: list[Column] = [("precision", "precision", text), *STREAMED_RUN, ("wrong writes", "wrong_writes", num)]
    found = d.get("precision") or {}
    rows = []
    for r in found.get("rows", []):
        em = r["exact_match_diff"]
        rows.append(
            (
                f"{r['precision']} vs {found['reference']}",
                num(r["concurrency"]),
                num(r["output_tokens_per_s_ratio"]),
                num(r["ttft_ratio"]),
                num(r["itl_ratio"]),
                signed(em.get("diff")),
                interval(em.get("low"), em.get("high"), signed),
                num(em.get("n")),
                "yes" if r["quality_held"] else "no",
                " vs ".join(f"{k} {v}" for k, v in r["wrong_writes"].items()),
            )
        )
    headers = [
        "comparison",
        "c",
        "output tokens/s ratio",
        "TTFT ratio",
        "ITL ratio",
        "exact match difference",
        "paired 95 %",
        "n (requests)",
        f"held at margin {found.get('margin')}",
        "wrong writes",
    ]
    blocks = [
        columns(runs, spec),
        table(headers, rows),
        f"Throughput, TTFT and ITL ratios are one timed pass per precision: {NO_INTERVAL}.",
        curve(result, "throughput", "precision", "output_tokens_per_s", "output tokens/s", n_of(runs), runs),
        curve(result, "itl", "precision", "itl_ms", "ITL (ms)", n_of(runs), runs),
    ]
    return Body(what, blocks)


def _precision_of(label: str, served: Any) -> str:
    """A run's precision from its label: a benchmark copy's own ("v3 at bf16 (benchmark copy)"), else the live
    model's, served at `served`."""
    if " at " in label and "(benchmark copy)" in label:
        return label.split(" at ", 1)[1].split(" ", 1)[0]
    return f"{served} (live)"


def shared_prefix(result: Result) -> Body:
    """bench/shared_prefix.py: each batch decoded with the shared opening computed once and prefilled whole."""
    d = result.data
    s = d.get("speedup") or {}
    head = table(
        ["n (requests)", "batches", "speedup (whole / shared)", "95 % interval", "identical answers",
         "seconds whole", "seconds shared", "tokens the whole sample shares"],
        [(num(d.get("n")), num(s.get("n")), num(s.get("mean")), interval(s.get("low"), s.get("high")),
          f"{num(d.get('identical_answers'))} of {num(d.get('n'))}", num(d.get("seconds_whole")),
          num(d.get("seconds_shared")), num(d.get("sample_shared_prefix_tokens")))],
    )  # fmt: skip
    spec = [
        ("batch", "batch", num),
        ("requests", "requests", num),
        ("first pass", "first", text),
        ("prompt tokens (mean)", "prompt_tokens_mean", num),
        ("shared tokens", "shared_prefix_tokens", num),
        ("output tokens", "output_tokens", num),
        ("s whole", "seconds_whole", num),
        ("s shared", "seconds_shared", num),
        ("speedup", "speedup", num),
        ("identical answers", "identical_answers", num),
    ]
    note = (
        "The speedup is the geometric mean over batches; its interval is the paired 95 % t-interval of the log. A "
        "batch's shared tokens can exceed what the whole sample (an evaluation condition) shares."
    )
    return Body(
        d.get("what", "Batched decoding with a shared opening."), [head, columns(d.get("batches") or [], spec), note]
    )
