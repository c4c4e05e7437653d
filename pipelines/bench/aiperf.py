"""NVIDIA AIPerf against the gateway's OpenAI endpoint: the tuned champion vs base + few-shot, streamed.

AIPerf (PyPI `aiperf`, its own venv: `make aiperf-env`) is the ecosystem's load generator for
OpenAI-compatible endpoints. It replays our requests (generated shopper turns with their `tools` and
customer id, a `mooncake_trace` dataset without timestamps) against `POST /v1/chat/completions` with
`stream: true`, at each concurrency, for the `champion` alias (the tuned model, short prompt) and the
`base` alias (the base model with the gateway's retrieved examples and the full prompt), and measures
time to first token (the first SSE chunk carrying content or a tool-call delta), inter-token latency,
request latency and throughput. Token counts come from the gateway's `usage` (`--use-server-token-count`);
the tokenizer is the served base model's, from local files (no model hub). Every request counts:
AIPerf's error count is in every row. `flywheel bench --aiperf` and `bench/aiperf.py` run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pipelines.config import Settings
from pipelines.errors import NotRetryable

METRICS = {"ttft": "time_to_first_token", "itl": "inter_token_latency", "latency": "request_latency"}
BASE_MODEL = "smollm2-135m-instruct"
COLUMNS = (
    "model",
    "concurrency",
    "requests",
    "errors",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "latency_p50_ms",
    "latency_p99_ms",
    "requests_per_s",
    "prompt_tokens_p50",
    "output_tokens_p50",
)


class AiperfFailed(NotRetryable):
    """AIPerf is missing, failed, or ran past its time limit."""


def executable(configured: str | None = None) -> Path:
    """The AIPerf executable: `bench.aiperf` when set, else the repository's .venv-aiperf (`make aiperf-env`)."""
    found = Path(configured or Path(__file__).resolve().parents[2] / ".venv-aiperf" / "bin" / "aiperf")
    if not found.is_file():
        raise AiperfFailed(f"AIPerf is not installed ({found}): run `make aiperf-env` first")
    return found


def trace_lines(n: int, seed: int = 41) -> list[dict[str, Any]]:
    """Generated shopper turns as AIPerf trace lines: OpenAI messages, tools and the customer id."""
    import orjson

    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator

    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=n, bad_share=0.0, end_date=date.today()))
    records = [orjson.loads(line) for _, line, _ in gen.lines()]
    return [
        {"messages": r["request"]["messages"], "tools": r["request"]["tools"], "extra": {"user": r["customer_id"]}}
        for r in records
    ]


def run_config(model: str, url: str, level: int, requests: int, trace: Path, folder: Path) -> str:
    """One run as an AIPerf YAML config: a warm-up request, then `requests` at `level` in flight, streamed,
    replaying `trace`. The API key is AIPerf's `${OPENAI_API_KEY}`, resolved from its environment: the key
    is never on a command line (any local user can read those) nor in a file, and AIPerf redacts it in
    its exports."""
    import yaml

    return yaml.safe_dump(
        {
            "schemaVersion": "2.0",
            "benchmark": {
                "model": model,
                "endpoint": {"url": url, "type": "chat", "streaming": True, "api_key": "${OPENAI_API_KEY}"},
                "dataset": {"type": "file", "path": str(trace), "format": "mooncake_trace"},
                "phases": [
                    {
                        "name": "warmup",
                        "type": "concurrency",
                        "excludeFromResults": True,
                        "requests": 1,
                        "concurrency": 1,
                    },
                    {"name": "profiling", "type": "concurrency", "requests": requests, "concurrency": level},
                ],
                "artifacts": {"dir": str(folder)},
            },
        },
        sort_keys=False,
    )


def command(aiperf: Path, config: Path, tokenizer: str) -> list[str]:
    """The `aiperf profile` command line of one run (`run_config` written to `config`): token counts from
    the gateway's `usage`, no UI, no metrics scraping, one worker (the load generator shares the cores)."""
    return [
        str(aiperf),
        "profile",
        "--config",
        str(config),
        "--tokenizer",
        tokenizer,
        "--use-server-token-count",
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--workers-max",
        "1",
        "--record-processors",
        "1",
    ]


def summarize(export: dict[str, Any]) -> dict[str, Any]:
    """AIPerf's summary export (`profile_export_aiperf.json`) as our row: medians and p99 in ms,
    requests/s, requests and errors (AIPerf reports an error count only when there were errors)."""

    def stat(metric: str, key: str) -> float | None:
        value = (export.get(metric) or {}).get(key)
        return round(float(value), 1) if value is not None else None

    ok = int((export.get("request_count") or {}).get("avg") or 0)
    errors = int((export.get("error_request_count") or {}).get("avg") or 0)
    return {
        "ttft_p50_ms": stat(METRICS["ttft"], "p50"),
        "ttft_p99_ms": stat(METRICS["ttft"], "p99"),
        "itl_p50_ms": stat(METRICS["itl"], "p50"),
        "latency_p50_ms": stat(METRICS["latency"], "p50"),
        "latency_p99_ms": stat(METRICS["latency"], "p99"),
        "requests_per_s": round(float((export.get("request_throughput") or {}).get("avg") or 0.0), 3),
        "requests": ok + errors,
        "errors": errors,
        "prompt_tokens_p50": stat("input_sequence_length", "p50"),
        "output_tokens_p50": stat("output_sequence_length", "p50"),
    }


@dataclass(frozen=True)
class _Runs:
    """What every AIPerf run of one benchmark shares: the executable, the gateway's address, the environment
    (the gateway's key in it), the tokenizer, the replayed trace, the report folder, the requests per run and
    each run's time limit."""

    aiperf: Path
    url: str
    env: dict[str, str]
    tokenizer: str
    trace: Path
    folder: Path
    requests: int
    timeout_s: float


def run_aiperf(
    settings: Settings,
    requests: int,
    levels: list[int],
    models: tuple[str, ...] = ("champion", "base"),
    timeout_s: float = 900,
    say: Any = print,
) -> dict[str, Any]:
    """AIPerf against the running gateway for each model alias and concurrency; the report (JSON + HTML
    under `reports/aiperf/<time>/`, AIPerf's own exports beside them)."""
    from pipelines.base_models import prepare_base
    from pipelines.gateway import app as gateway
    from pipelines.serve import deploy

    aiperf = executable(settings.bench.aiperf)
    live = deploy.live_model(settings)
    if live is None:
        raise AiperfFailed("no live model to benchmark: run `flywheel deploy` first")
    if "base" in models:  # the `base` alias answers only while the base model is loaded
        _load_base(settings, live)
    gateway.up(settings)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder = Path(str(settings.root)) / "reports" / "aiperf" / stamp
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "requests.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in trace_lines(requests)))
    url = gateway.base_url(settings).removesuffix("/v1")
    # not HF offline mode: AIPerf then looks the tokenizer up as a hub snapshot, which a local folder is not
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")},
        "OPENAI_API_KEY": gateway.api_key(settings),
    }
    tokenizer = prepare_base(BASE_MODEL, settings)
    shared = _Runs(aiperf, url, env, str(tokenizer), trace, folder, requests, timeout_s)
    runs = []
    started = time.perf_counter()
    for model in models:
        for level in levels:
            row = _profile(shared, model, level, say)
            runs.append(row)
            say(json.dumps({k: v for k, v in row.items() if k != "export"}))
    report: dict[str, Any] = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "live": live.name,
        "aiperf": _version(aiperf),
        "requests_per_run": requests,
        "streaming": True,
        "runs": runs,
        "seconds": round(time.perf_counter() - started, 1),
        "note": "AIPerf 'profile' against the gateway (/v1/chat/completions, stream: true); champion = the "
        "tuned model with its short prompt, base = the base model + retrieved examples, full prompt; "
        "grammar as served; token counts from the gateway's usage",
    }
    report["json_uri"], report["html_uri"] = str(folder / "report.json"), str(folder / "report.html")
    Path(report["json_uri"]).write_text(json.dumps(report, indent=2) + "\n")
    Path(report["html_uri"]).write_text(render_html(report))
    return report


def _load_base(settings: Settings, live: Any) -> None:
    """The base model's folder, current (`bench.serving._base_entry`), and loaded on Triton unless it is."""
    from pipelines.bench.serving import _base_entry
    from pipelines.serve.client import TritonClient

    client = TritonClient(settings)
    try:
        base = _base_entry(settings, client, BASE_MODEL, live)
        if not client.ready(base.name):
            client.load(base.name)
    finally:
        client.close()


def _profile(runs: _Runs, model: str, level: int, say: Any) -> dict[str, Any]:
    """One `aiperf profile` run of `model` at `level` in flight: its row (AIPerf's summary, the seconds it took,
    the export it was read from); its console log beside its exports."""
    out = runs.folder / f"{model}-c{level}"
    say(f"aiperf: {model} at concurrency {level} ({runs.requests} requests) ...")
    t0 = time.perf_counter()
    config = runs.folder / f"{model}-c{level}.yaml"
    config.write_text(run_config(model, runs.url, level, runs.requests, runs.trace, out))
    try:
        done = subprocess.run(  # noqa: S603 (our own executable and arguments)
            command(runs.aiperf, config, runs.tokenizer),
            env=runs.env,
            capture_output=True,
            text=True,
            timeout=runs.timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise AiperfFailed(
            f"AIPerf ran past {runs.timeout_s:.0f} s on {model} at concurrency {level}; "
            f"its exports so far are under {out}"
        ) from None
    out.mkdir(parents=True, exist_ok=True)
    (out / "aiperf-console.log").write_text(done.stdout + done.stderr)
    exports = [e for e in (out / "profile_export_aiperf.json",) if e.is_file()] or sorted(
        out.rglob("profile_export_aiperf.json")
    )  # the run's summary; a deeper one only if AIPerf nests it
    if done.returncode != 0 or not exports:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise AiperfFailed(
            f"AIPerf failed on {model} at concurrency {level} (exit {done.returncode}): "
            f"{tail[0][:300]}; its log: {out / 'aiperf-console.log'}"
        )
    return {
        "model": model,
        "concurrency": level,
        **summarize(json.loads(exports[-1].read_text())),
        "seconds": round(time.perf_counter() - t0, 1),
        "export": str(exports[-1]),
    }


def render_html(report: dict[str, Any]) -> str:
    from pipelines.bench.report import concurrency_figure
    from pipelines.reports import figure_html, page, table_html

    runs = report["runs"]
    fig = concurrency_figure(
        runs, ("ttft_p50_ms", "TTFT p50"), ("latency_p50_ms", "latency p50"), "time to first token and latency"
    )
    rows = [{c: ("n/a" if r.get(c) is None else r.get(c)) for c in COLUMNS} for r in runs]
    return page(
        f"AIPerf against the gateway: {report['live']} vs base + few-shot",
        [
            ("Runs", table_html(rows)),
            ("Latency and throughput", figure_html(fig, "TTFT, latency and throughput against concurrency")),
        ],
        subtitle=f"AIPerf {report.get('aiperf')}, {report['requests_per_run']} streamed requests per run; "
        f"generated {report['generated_at']}",
    )


def _version(aiperf: Path) -> str | None:
    try:
        done = subprocess.run(  # noqa: S603 (our own executable and arguments)
            [str(aiperf.parent / "python"), "-c", "import importlib.metadata as m; print(m.version('aiperf'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):  # an aiperf outside a venv of its own: no version, the runs stand
        return None
    return done.stdout.strip() or None
