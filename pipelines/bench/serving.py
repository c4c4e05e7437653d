"""The serving benchmark: the case study's latency and cost table, measured side by side in one run.

(a) the base model with in-context examples (full prompt with every tool schema + k retrieved
demonstrations) against (b) the tuned model with its short prompt, both through Triton at increasing
concurrency on the same test-split requests; and (c) Triton's overhead against direct in-process
inference of the tuned model (batch 1). Quality is scored on the very answers that were timed.
The hardware table (`pipelines.hardware`) turns throughput into $ per million requests.
Every request is streamed (the model is decoupled): time to first token (TTFT) is when its first text
arrived, inter-token latency (ITL) the mean time per output token after the first, both as medians.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipelines.config import DECODINGS, BenchSettings, Settings, decoding_modes
from pipelines.errors import NotRetryable
from pipelines.hardware import detect, usd_per_million
from pipelines.serve import repository
from pipelines.serve.client import Reply, TritonClient, conversation
from pipelines.serve.deploy import DeployFailed, live_model, score_replies, smoke_rows
from pipelines.stack import triton as server
from pipelines.storage import write_json, write_text

CONSTRAINED_LABEL = ", constrained"  # a row decoded under the offered tools' grammar


def min_samples(q: float) -> int:
    """The smallest sample that supports a q-th percentile: some values must lie above it (p95: 20,
    p99: 100); a median needs one."""
    return 1 if q <= 50 else math.ceil(100 / (100 - q) - 1e-9)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100): the value at or above q% of the sample; None where the
    sample is too small to support it (`min_samples`), so 8 requests report no p95 rather than their max."""
    if len(values) < min_samples(q) or not values:
        return None
    ordered = sorted(values)
    return round(ordered[nearest_rank(len(ordered), q) - 1], 1)


def nearest_rank(n: int, q: float) -> int:
    """The 1-based rank of the nearest-rank q-th percentile of n values: ceil(n q / 100), at least 1."""
    return int(max(1, -(-n * q // 100)))


def summarize_run(
    label: str,
    concurrency: int,
    rows: list[dict[str, Any]],
    replies: list[Reply],
    seconds: float,
    timeout_ms: float | None = None,
) -> dict[str, Any]:
    """One model at one concurrency. Every request counts: an errored one is a wrong answer in exact
    match and a latency sample at the client's timeout (`timeout_ms`; at least the time it took), so a
    server that fails fast does not look fast; requests/s counts answered requests only (goodput);
    `requests` and `errors` say how many were sent and failed."""
    ok = [r for r in replies if r.error is None]
    latencies = [r.latency_ms if r.error is None else max(r.latency_ms, timeout_ms or 0.0) for r in replies]
    quality = score_replies(rows, replies)
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "model": label,
        "concurrency": concurrency,
        "requests": len(replies),
        "errors": len(replies) - len(ok),
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "p99_ms": percentile(latencies, 99),
        "requests_per_s": round(len(ok) / seconds, 3) if seconds else 0.0,
        "output_tokens_per_s": round(out_tokens / seconds, 1) if seconds else 0.0,
        "prompt_tokens_mean": quality["prompt_tokens_mean"],
        "exact_match": quality["exact_match"],
        "name_accuracy": quality["name_accuracy"],
        "ttft_ms": percentile([r.first_token_ms for r in ok if r.first_token_ms is not None], 50),
        "itl_ms": percentile([r.inter_token_ms for r in ok if r.inter_token_ms is not None], 50),
        "first_error": next((r.error for r in replies if r.error), None),
        "latencies_ms": [round(x, 1) for x in latencies],  # every request, in the rows' order (errors too)
        "errored": [i for i, r in enumerate(replies) if r.error is not None],
    }


TABLE_COLUMNS = (
    "model",
    "decoding",
    "in flight",
    "requests",
    "errors",
    "TTFT ms",
    "ITL ms",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "req/s",
    "prompt tokens",
    "exact",
    "$/M req",
)
_TABLE_KEYS = (
    "concurrency",
    "requests",
    "errors",
    "ttft_ms",
    "itl_ms",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "requests_per_s",
    "prompt_tokens_mean",
    "exact_match",
    "usd_per_million_requests",
)


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """The report's runs (and the in-process run) as text cells under TABLE_COLUMNS: what the CLI and
    the demo print; a figure the sample does not support reads "n/a"."""

    def cell(value: Any) -> str:
        if value is None:
            return "n/a"
        return f"{value:.3f}" if isinstance(value, float) and abs(value) < 10 else str(value)

    runs = [*report["runs"], *([report["direct"]] if report.get("direct") else [])]
    rows = []
    for r in runs:
        constrained = r.get("constrained", r["model"].endswith(CONSTRAINED_LABEL))
        name = r["model"].removesuffix(CONSTRAINED_LABEL)
        rows.append([name, "grammar" if constrained else "free", *(cell(r.get(k)) for k in _TABLE_KEYS)])
    return rows


def prompt_tokens(tokenizer: Any, turns: list[dict[str, str]]) -> int:
    """Tokens of a conversation's prompt, counted as the served model counts them (triton_backend/model.py)."""
    prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(prompt, add_special_tokens=False).input_ids)


def check_prompt_lengths(tokenizer: Any, planned: dict[str, tuple[list[list[dict[str, str]]], int]]) -> dict[str, int]:
    """The longest prompt per model ({label: (conversations, the model's max_input_tokens)}); one
    clear error before anything is timed if a model would refuse one (it answers an oversize prompt
    with an error, which would count as a failed request)."""
    longest = {}
    for label, (conversations, limit) in planned.items():
        longest[label] = max((prompt_tokens(tokenizer, c) for c in conversations), default=0)
        if longest[label] > limit:
            raise PromptTooLong(
                f"the longest {label} prompt is {longest[label]} tokens but the model accepts at most "
                f"{limit} (triton.max_input_tokens): raise it (FLYWHEEL_TRITON__MAX_INPUT_TOKENS; a "
                f"model live with a lower limit needs a new deployment) or lower bench.shots"
            )
    return longest


class PromptTooLong(NotRetryable):
    """A benchmark prompt is longer than the served model accepts."""


def run_bench(settings: Settings, cfg: BenchSettings | None = None, console: Console | None = None) -> dict[str, Any]:
    """Benchmark the live model and the base+few-shot baseline through the running Triton server. With
    `triton.multi_lora` the baseline's own base model is unloaded afterwards: the shared model stays the one
    copy of the base in memory."""
    from pipelines.prep.dataset import load_split
    from pipelines.toolcall.examples import to_examples
    from pipelines.toolcall.fewshot import shot_pool, with_shots

    cfg = cfg or settings.bench
    live = live_model(settings)
    if live is None:
        raise DeployFailed("no live model to benchmark: run `flywheel deploy` first")
    server.up(settings)
    rows = smoke_rows(settings, cfg.requests)
    import pandas as pd

    frame = pd.DataFrame(rows)
    full = to_examples(frame, "full")
    pool = shot_pool(to_examples(load_split(settings, "train", 2000), "full"))
    base_model = _base_model_of(settings, live)
    client = TritonClient(settings, cfg.protocol)  # type: ignore[arg-type]
    results: list[dict[str, Any]] = []
    modes = DECODINGS[decoding_modes(cfg.constrained, settings.triton.constrained)]
    served = settings.triton.constrained if settings.triton.constrained in modes else modes[0]
    started = time.perf_counter()
    base = None
    try:
        base = _base_entry(settings, client, base_model, live)
        conversations = {
            base.name: with_shots(full, pool, cfg.shots),
            live.name: [conversation(r, live.prompt_style) for r in rows],
        }
        labels = {
            base.name: f"base + {cfg.shots}-shot (full prompt)",
            live.name: f"tuned v{live.version} ({live.prompt_style} prompt)",
        }
        longest = check_prompt_lengths(
            _tokenizer(settings, base_model),
            {labels[m]: (conversations[m], repository.configured_limit(settings, m)) for m in (base.name, live.name)},
        )
        if not client.ready(live.name):
            raise DeployFailed(f"{live.name} is live but not loaded on the server (restarted?): run `flywheel deploy`")
        if not client.ready(base.name):
            client.load(base.name)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            for name in (base.name, live.name):
                for constrained in (m for m in modes if not m or client.accepts_tools(name)):
                    label = labels[name] + (CONSTRAINED_LABEL if constrained else "")
                    tools = [r["tools_json"] for r in rows] if constrained else None
                    client.infer_one(name, conversations[name][0], tools[0] if tools else None)  # warm-up
                    for level in cfg.concurrency:
                        task = progress.add_task(f"{label} x{level}", total=len(rows))
                        t0 = time.perf_counter()
                        replies = client.infer(name, conversations[name], concurrency=level, tools=tools, stream=True)
                        progress.update(task, completed=len(rows))
                        results.append(
                            {
                                **summarize_run(
                                    label, level, rows, replies, time.perf_counter() - t0, client.timeout_s * 1000
                                ),
                                "constrained": constrained,
                            }
                        )
    finally:
        try:
            if (
                base is not None and settings.triton.multi_lora and client.ready(base.name)
            ):  # one base in memory: the shared one
                client.unload(base.name, wait_s=120)
        except Exception as exc:  # noqa: BLE001 (a clean-up: it never hides the benchmark's own outcome)
            logging.getLogger(__name__).warning("could not unload the benchmark's base %s: %s", base.name, exc)
        finally:
            client.close()
    direct = _direct(settings, live, conversations[live.name], rows, served) if cfg.direct else None
    hardware = detect()

    # the headline compares the rows decoded the way models are served (`triton.constrained`)
    def rows_of(name: str, constrained: bool) -> list[dict[str, Any]]:
        return [
            r
            for r in results
            if r["model"] == labels[name]
            and not constrained
            or r["model"] == labels[name] + CONSTRAINED_LABEL
            and constrained
        ]

    if served and not (rows_of(live.name, True) and rows_of(base.name, True)):
        served = False  # a model without the TOOLS input (kept from before) was timed unconstrained only
    tuned, baseline = rows_of(live.name, served), rows_of(base.name, served)
    for r in results:
        r["usd_per_million_requests"] = _round(usd_per_million(r["requests_per_s"], hardware))
    comparison = _compare(baseline[0], tuned[0]) if baseline and tuned else {}
    report = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "live": live.name,
        "version": live.version,
        "baseline": base.name,
        "requests": len(rows),
        "protocol": cfg.protocol,
        "hardware": hardware.__dict__,
        "longest_prompt_tokens": longest,
        "runs": results,
        "direct": direct,
        "comparison": comparison,
        "constrained": served,
        "triton_overhead_ms": round(tuned[0]["p50_ms"] - direct["p50_ms"], 1) if direct and tuned else None,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return write_report(settings, report)


def _base_model_of(settings: Settings, live: Any) -> str:
    """The base model the live deployment was built on (its repository's metadata, local or on S3)."""
    from pipelines.serve import shared_base

    return str(shared_base.served_meta(settings, live.name)["base_model"])


def _base_entry(settings: Settings, client: TritonClient, base_model: str, live: Any) -> repository.ModelEntry:
    """The base model's folder, current with the settings and the live model's answer budget: a loaded base
    built otherwise (say a lower max_input_tokens) is unloaded first (it only serves benchmarks), then
    rewritten."""
    name = repository.triton_name(settings, None)
    budget = repository.configured_limit(settings, live.name, "max_new_tokens")  # the model it is compared with
    base = repository.build_base(settings, base_model, in_use=client.ready(name), budget=budget)
    if base.stale:
        client.unload(base.name, wait_s=120)
        base = repository.build_base(settings, base_model, in_use=False, budget=budget)
    return base


def _tokenizer(settings: Settings, base_model: str) -> Any:
    from transformers import AutoTokenizer

    from pipelines.base_models import prepare_base

    return AutoTokenizer.from_pretrained(prepare_base(base_model, settings))


def _direct(
    settings: Settings,
    live: Any,
    conversations: list[list[dict[str, str]]],
    rows: list[dict[str, Any]],
    constrained: bool,
) -> dict[str, Any]:
    """The same requests through the same merged model in this process, batch 1, decoded as served
    (constrained or not): Triton's overhead."""
    from pipelines.base_models import load_model
    from pipelines.registry.models import adapter_path
    from pipelines.toolcall.decode import generate

    model, tokenizer = load_model(_base_model_of(settings, live), settings, adapter_path(settings, live.version))
    tools = [r["tools_json"] for r in rows] if constrained else [None] * len(rows)
    budget = repository.configured_limit(settings, live.name, "max_new_tokens")  # as Triton serves it
    generate(
        model,
        tokenizer,
        conversations[:1],
        max_new_tokens=budget,
        latency_samples=0,
        tools=tools[:1] if constrained else None,
    )  # warm-up, as for the served models
    replies = []
    for turns, offered in zip(conversations, tools):
        t0 = time.perf_counter()
        out = generate(
            model,
            tokenizer,
            [turns],
            max_new_tokens=budget,
            latency_samples=0,
            tools=[offered] if offered is not None else None,
        )
        replies.append(
            Reply(out.texts[0], out.prompt_tokens[0], out.output_tokens[0], (time.perf_counter() - t0) * 1000)
        )
    return summarize_run(
        f"tuned v{live.version} in-process (no Triton){CONSTRAINED_LABEL if constrained else ''}",
        1,
        rows,
        replies,
        sum(r.latency_ms for r in replies) / 1000,
    )


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
MIN_PAIRS = 8  # below it the bootstrapped median takes too few values for a 95 % interval to hold its coverage


def paired_p50_change_ci(
    base: list[float],
    tuned: list[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    min_pairs: int = MIN_PAIRS,
) -> list[float] | None:
    """95 % interval of the median latency's relative change, tuned against base: a percentile bootstrap over
    the requests, paired (both models answered the same requests: request i's two latencies are resampled
    together). It covers which requests were drawn, given each model's one timed pass (not what moved between
    the passes). None with fewer than `min_pairs` pairs, lists of different lengths, or a resample whose base
    median is not above 0."""
    import numpy as np

    if len(base) != len(tuned) or len(base) < max(2, min_pairs):
        return None
    a, b = np.asarray(base, dtype=float), np.asarray(tuned, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
    rank = nearest_rank(len(a), 50) - 1  # the median as `percentile` takes it
    low, high = np.sort(a[picks], axis=1)[:, rank], np.sort(b[picks], axis=1)[:, rank]
    if not (low > 0).all():
        return None
    lo, hi = np.percentile((high - low) / low, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)] if np.isfinite([lo, hi]).all() else None


def _compare(base: dict[str, Any], tuned: dict[str, Any]) -> dict[str, Any]:
    def change(a: float | None, b: float | None) -> float | None:
        return round((b - a) / a, 3) if a and b is not None else None

    a, b = base.get("latencies_ms") or [], tuned.get("latencies_ms") or []
    pairs, level = min(len(a), len(b)), tuned["concurrency"]
    ci = paired_p50_change_ci(a, b) if level == 1 else None
    if ci is not None:
        interval = (
            f"percentile bootstrap over the {pairs} requests, paired ({BOOTSTRAP_RESAMPLES} resamples, seed "
            f"{BOOTSTRAP_SEED}), one request at a time; it covers which requests were drawn, given each "
            "model's one timed pass"
        )
    else:
        interval = "none: " + (
            f"at concurrency {level} requests in flight together slow each other, so they are "
            "not resampled as independent"
            if level != 1
            else f"{pairs} requests, fewer than the {MIN_PAIRS} an interval of the median needs"
            if pairs < MIN_PAIRS
            else "the two models' request lists differ, or a resample's base median is 0"
        )
    return {
        "latency_p50_change": change(base["p50_ms"], tuned["p50_ms"]),
        "latency_p50_change_ci95": ci,
        "paired_requests": pairs,
        "concurrency": level,
        "interval": interval,
        "prompt_tokens_change": change(base["prompt_tokens_mean"], tuned["prompt_tokens_mean"]),
        "throughput_change": change(base["requests_per_s"], tuned["requests_per_s"]),
        "cost_change": change(base.get("usd_per_million_requests"), tuned.get("usd_per_million_requests")),
        "exact_match": {"base_few_shot": base["exact_match"], "tuned": tuned["exact_match"]},
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def write_report(settings: Settings, report: dict[str, Any]) -> dict[str, Any]:
    from pipelines.bench.report import render_html

    stamp = report["generated_at"].replace(":", "").replace("-", "")
    folder = f"{settings.zone('reports')}/bench/{stamp}"
    report["json_uri"] = f"{folder}/report.json"
    report["html_uri"] = f"{folder}/report.html"
    write_json(report["json_uri"], report)
    write_text(report["html_uri"], render_html(report))
    write_json(f"{settings.zone('reports')}/bench/latest.json", report)
    _log_to_mlflow(settings, report, folder)
    return report


def _log_to_mlflow(settings: Settings, report: dict[str, Any], folder: str) -> None:
    """The report on the model version's run (artifacts) and its headline figures as version tags."""
    import json
    import tempfile

    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.storage import read_bytes

    client = mlflow_client(settings)
    name, version = settings.mlflow.registered_model, str(report["version"])
    run_id = client.get_model_version(name, version).run_id
    with tempfile.TemporaryDirectory() as tmp:  # the reports may live on object storage
        for file in ("report.json", "report.html"):
            (Path(tmp) / file).write_bytes(read_bytes(f"{folder}/{file}"))
        client.log_artifacts(run_id, tmp, "benchmark")
    tuned = [
        r
        for r in report["runs"]
        if r["model"].startswith("tuned") and r.get("constrained", False) == report.get("constrained", False)
    ]
    headline = {
        "hardware": report["hardware"]["name"],
        "p50_ms_c1": tuned[0]["p50_ms"] if tuned else None,
        "best_requests_per_s": max((r["requests_per_s"] for r in tuned), default=None),
        **{k: v for k, v in report["comparison"].items() if not isinstance(v, dict)},
    }
    client.set_model_version_tag(name, version, "flywheel.benchmark", json.dumps(headline))
