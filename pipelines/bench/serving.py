"""The serving benchmark: the case study's latency and cost table, measured side by side in one run.

(a) the base model with in-context examples (full prompt with every tool schema + k retrieved
demonstrations) against (b) the tuned model with its short prompt, both through Triton at increasing
concurrency on the same test-split requests; and (c) Triton's overhead against direct in-process
inference of the tuned model (batch 1). Quality is scored on the very answers that were timed.
The hardware table (`pipelines.hardware`) turns throughput into $ per million requests.
Every request is streamed (the model is decoupled): time to first token (TTFT) is when its first text
arrived, inter-token latency (ITL) the mean time per output token after the first, both as medians.
The figures made of the timed replies (percentiles, rows, the comparison) are `bench.results`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipelines.bench.results import CONSTRAINED_LABEL, _compare, _round, precision_comparison, summarize_run
from pipelines.config import DECODINGS, BenchSettings, Settings, decoding_modes
from pipelines.errors import NotRetryable
from pipelines.hardware import detect, usd_per_million
from pipelines.serve import repository
from pipelines.serve.client import Reply, TritonClient
from pipelines.serve.deploy import DeployFailed, live_model, smoke_rows
from pipelines.serve.prompts import conversation
from pipelines.stack import triton as server
from pipelines.storage import write_json, write_text


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


@dataclass(frozen=True)
class _Arm:
    """One model the benchmark times: its Triton name, the label of its rows and the conversations it is sent."""

    name: str
    label: str
    conversations: list[list[dict[str, str]]]


@dataclass(frozen=True)
class _Precision:
    """The live version at one precision: its arm, and whether it is a copy this benchmark loaded (and unloads)."""

    precision: str
    arm: _Arm
    copy: bool


def _precision_arms(
    settings: Settings, client: TritonClient, live: Any, tuned: _Arm, precisions: Sequence[str]
) -> list[_Precision]:
    """The live version at each of `precisions`: the live model itself at the precision it is served at (a
    merged folder; a shared base is never one), else a copy of its folder built at that precision
    (`<version's name>_<precision>`; `run_bench` loads it, and unloads it after)."""
    served = None if settings.triton.multi_lora else settings.triton.precision
    arms = []
    for precision in precisions:
        if precision == served:
            arms.append(_Precision(precision, tuned, False))
            continue
        at = settings.model_copy(update={"triton": settings.triton.model_copy(update={"precision": precision})})
        name = f"{repository.triton_name(settings, live.version)}_{precision}"
        entry = repository.build_version(at, live.version, in_use=client.ready(name), name=name)
        if entry.stale:  # a copy left loaded (an earlier run stopped) but built otherwise: rebuilt, not timed stale
            client.unload(name, wait_s=120)
            entry = repository.build_version(at, live.version, name=name)
        arms.append(
            _Precision(
                precision,
                _Arm(entry.name, f"v{live.version} at {precision} (benchmark copy)", tuned.conversations),
                True,
            )
        )
    return arms


def run_bench(settings: Settings, cfg: BenchSettings | None = None, console: Console | None = None) -> dict[str, Any]:
    """Benchmark the live model and the base+few-shot baseline through the running Triton server. With
    `triton.multi_lora` the baseline's own base model is unloaded afterwards: the shared model stays the one
    copy of the base in memory."""
    cfg = cfg or settings.bench
    live = live_model(settings)
    if live is None:
        raise DeployFailed("no live model to benchmark: run `flywheel deploy` first")
    server.up(settings)
    rows = smoke_rows(settings, cfg.requests)
    base_model = _base_model_of(settings, live)
    client = TritonClient(settings, cfg.protocol)
    modes = DECODINGS[decoding_modes(cfg.constrained, settings.triton.constrained)]
    served = settings.triton.constrained if settings.triton.constrained in modes else modes[0]
    started = time.perf_counter()
    base = None
    precisions: list[_Precision] = []
    try:
        base = _base_entry(settings, client, base_model, live) if cfg.baseline else None
        baseline = _baseline_arm(settings, rows, base, cfg.shots) if base is not None else None
        at = f", {settings.triton.precision}" if cfg.precisions and not settings.triton.multi_lora else ""
        tuned = _Arm(
            live.name,
            f"tuned v{live.version} ({live.prompt_style} prompt{at})",
            [conversation(r, live.prompt_style) for r in rows],
        )
        longest = check_prompt_lengths(
            _tokenizer(settings, base_model),
            {
                a.label: (a.conversations, repository.configured_limit(settings, a.name))
                for a in (baseline, tuned)
                if a is not None  # only the prompts that are sent
            },
        )
        if not client.ready(live.name):
            raise DeployFailed(f"{live.name} is live but not loaded on the server (restarted?): run `flywheel deploy`")
        if base is not None and not client.ready(base.name):
            client.load(base.name)
        precisions = _precision_arms(settings, client, live, tuned, cfg.precisions)
        copies = tuple(p.arm for p in precisions if p.copy)
        for copy in copies:
            client.load(copy.name)
        timed = ((baseline,) if baseline is not None else ()) + (tuned, *copies)
        results = _time_runs(client, timed, rows, modes, cfg.concurrency, console)
    finally:
        _unload_copies(client, precisions)
        _unload_base(settings, client, base)
    direct = _direct(settings, live, tuned.conversations, rows, served) if cfg.direct else None
    hardware = detect(settings.bench.hardware)
    for r in results:
        r["usd_per_million_requests"] = _round(usd_per_million(r["requests_per_s"], hardware))
    served, tuned_rows, comparison = _headline(results, tuned, baseline, served)
    report = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "live": live.name,
        "version": live.version,
        "baseline": base.name if base is not None else None,
        "requests": len(rows),
        "protocol": cfg.protocol,
        "hardware": hardware.__dict__,
        "longest_prompt_tokens": longest,
        "runs": results,
        "direct": direct,
        "comparison": comparison,
        "precision": precision_comparison({p.precision: _rows_of(results, p.arm, served) for p in precisions}),
        "served_precision": "multi-LoRA shared base" if settings.triton.multi_lora else settings.triton.precision,
        "constrained": served,
        "triton_overhead_ms": round(tuned_rows[0]["p50_ms"] - direct["p50_ms"], 1) if direct and tuned_rows else None,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return write_report(settings, report)


def _baseline_arm(settings: Settings, rows: list[dict[str, Any]], base: repository.ModelEntry, shots: int) -> _Arm:
    """The base model with `shots` retrieved examples and the full prompt, on the benchmark's requests."""
    import pandas as pd

    from pipelines.prep.dataset import load_split
    from pipelines.toolcall.examples import to_examples
    from pipelines.toolcall.fewshot import shot_pool, with_shots

    pool = shot_pool(to_examples(load_split(settings, "train", 2000), "full"))
    return _Arm(
        base.name,
        f"base + {shots}-shot (full prompt)",
        with_shots(to_examples(pd.DataFrame(rows), "full"), pool, shots),
    )


def _headline(
    results: list[dict[str, Any]], tuned: _Arm, baseline: _Arm | None, served: bool
) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    """(the decoding the headline compares, the tuned model's rows so decoded, base + few-shot against tuned at the
    lowest concurrency; empty without a baseline). The rows decoded the way models are served (`triton.constrained`)
    unless a model without the TOOLS input (kept from before) was timed unconstrained only."""
    arms = [a for a in (tuned, baseline) if a is not None]
    if served and not all(_rows_of(results, a, True) for a in arms):
        served = False
    tuned_rows = _rows_of(results, tuned, served)
    base_rows = _rows_of(results, baseline, served) if baseline is not None else []
    return served, tuned_rows, _compare(base_rows[0], tuned_rows[0]) if base_rows and tuned_rows else {}


def _time_runs(
    client: TritonClient,
    arms: tuple[_Arm, ...],
    rows: list[dict[str, Any]],
    modes: list[bool],
    levels: list[int],
    console: Console | None,
) -> list[dict[str, Any]]:
    """Each model, decoded each way it takes (free, or under the offered tools' grammar), after one warm-up
    request, at each concurrency in `levels`: one summarized run each, every request streamed."""
    results: list[dict[str, Any]] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        for arm in arms:
            for constrained in (m for m in modes if not m or client.accepts_tools(arm.name)):
                label = arm.label + (CONSTRAINED_LABEL if constrained else "")
                tools = [r["tools_json"] for r in rows] if constrained else None
                client.infer_one(arm.name, arm.conversations[0], tools[0] if tools else None)  # warm-up
                for level in levels:
                    task = progress.add_task(f"{label} x{level}", total=len(rows))
                    t0 = time.perf_counter()
                    replies = client.infer(arm.name, arm.conversations, concurrency=level, tools=tools, stream=True)
                    progress.update(task, completed=len(rows))
                    results.append(
                        {
                            **summarize_run(
                                label, level, rows, replies, time.perf_counter() - t0, client.timeout_s * 1000
                            ),
                            "constrained": constrained,
                        }
                    )
    return results


def _unload_copies(client: TritonClient, precisions: list[_Precision]) -> None:
    """The benchmark's copies at other precisions, unloaded (a clean-up: it never hides the benchmark's outcome)."""
    for p in precisions:
        if not p.copy:
            continue
        try:
            if client.ready(p.arm.name):
                client.unload(p.arm.name, wait_s=120)
        except Exception as exc:  # noqa: BLE001
            logging.getLogger(__name__).warning("could not unload the benchmark's copy %s: %s", p.arm.name, exc)


def _unload_base(settings: Settings, client: TritonClient, base: repository.ModelEntry | None) -> None:
    """The benchmark's clean-up: with `triton.multi_lora` its own base copy is unloaded; the client is closed
    either way."""
    name = base.name if base is not None else None
    try:
        if name is not None and settings.triton.multi_lora and client.ready(name):  # one base in memory: the shared one
            client.unload(name, wait_s=120)
    except Exception as exc:  # noqa: BLE001 (a clean-up: it never hides the benchmark's own outcome)
        logging.getLogger(__name__).warning("could not unload the benchmark's base %s: %s", name, exc)
    finally:
        client.close()


def _rows_of(results: list[dict[str, Any]], arm: _Arm, constrained: bool) -> list[dict[str, Any]]:
    """The arm's rows decoded one way: under the grammar (`constrained`) or free."""
    return [
        r
        for r in results
        if r["model"] == arm.label and not constrained or r["model"] == arm.label + CONSTRAINED_LABEL and constrained
    ]


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
    (constrained or not, at the served precision): Triton's overhead."""
    from pipelines.base_models import load_as_served, precision_of
    from pipelines.registry.models import adapter_path
    from pipelines.toolcall.decode import generate

    adapter = adapter_path(settings, live.version)
    model, tokenizer = load_as_served(
        _base_model_of(settings, live), settings, adapter, what="the direct rows", **_served_at(settings, live.name)
    )
    tools = [r["tools_json"] for r in rows] if constrained else [None] * len(rows)
    budget = repository.configured_limit(settings, live.name, "max_new_tokens")  # as Triton serves it
    generate(
        model,
        tokenizer,
        conversations[:1],
        max_new_tokens=budget,
        latency_samples=0,
        tools=[r["tools_json"] for r in rows[:1]] if constrained else None,
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
    run = summarize_run(
        f"tuned v{live.version} in-process (no Triton){CONSTRAINED_LABEL if constrained else ''}",
        1,
        rows,
        replies,
        sum(r.latency_ms for r in replies) / 1000,
    )
    return {**run, "precision": precision_of(model)}


def _served_at(settings: Settings, name: str) -> dict[str, Any]:
    """The precision and `bf16_min_rows` the live model's folder was built with (a folder built under other
    settings keeps its own while it is live); model.py's defaults where the folder names none."""
    precision = repository.configured_param(settings, name, "precision") or "fp32"
    rows = repository.configured_param(settings, name, "bf16_min_rows")
    return {"precision": precision, "bf16_min_rows": int(rows) if rows else 4}


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
