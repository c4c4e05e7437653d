"""What the OpenAI-compatible gateway costs over calling Triton directly, on the live champion.

The same requests (generated shopper turns under our tools, constrained decoding as served) go
(a) straight to Triton with `TritonClient.infer_one` (the prompt built beforehand, untimed, with the
gateway's own functions), streamed from the decoupled model, (b) through the gateway with the official
`openai` client, and (c) through the gateway streamed (`stream: true`), at each concurrency. Every
request counts (an error is a latency sample at the time it took, and an `errors` column). The
difference at concurrency 1 is the gateway's overhead: parsing and validation, the Feast lookup, the
grammar check, the durable capture (fsync) and HTTP. Time to first token (TTFT): the first text from
Triton (direct), the first chunk from the gateway (it carries the role, sent with the first token);
`name_p50_ms`: when the call's tool name was known (the gateway's chunk carrying it).

Usage (a root where `make demo` ran: Triton up with a live champion):
  FLYWHEEL_ROOT=.flywheel .venv/bin/python bench/gateway.py [--requests 24] [--concurrency 1,4]
Writes bench/results/gateway.json.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _requests(n: int) -> list[dict[str, Any]]:
    """The generated shopper turns AIPerf replays (`pipelines.bench.aiperf.trace_lines`), as request bodies."""
    from pipelines.bench.aiperf import trace_lines

    return [
        {"model": "champion", "messages": t["messages"], "tools": t["tools"], "user": t["extra"]["user"]}
        for t in trace_lines(n)
    ]


def _run(
    label: str, level: int, jobs: list[dict[str, Any]], one: Callable[[dict[str, Any]], dict[str, Any]]
) -> dict[str, Any]:
    from pipelines.bench.results import percentile

    one(jobs[0])  # warm-up (a new connection, the first grammar build)
    started = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        results = list(pool.map(one, jobs))
    wall = time.perf_counter() - started
    latency = [r["ms"] for r in results]
    ttft = [r["ttft_ms"] for r in results if r.get("ttft_ms") is not None]
    named = [r["name_ms"] for r in results if r.get("name_ms") is not None]
    return {
        "path": label,
        "concurrency": level,
        "requests": len(results),
        "errors": sum(1 for r in results if r["error"]),
        "p50_ms": percentile(latency, 50),
        "p95_ms": percentile(latency, 95),
        "requests_per_s": round(len(results) / wall, 3),
        "ttft_p50_ms": percentile(ttft, 50) if ttft else None,
        "name_p50_ms": percentile(named, 50) if named else None,
        "error_examples": sorted({r["error"] for r in results if r["error"]})[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", default="1,4")
    args = parser.parse_args()

    from openai import OpenAI

    from pipelines.config import load_settings
    from pipelines.gateway import app as gateway
    from pipelines.gateway import openai_api as api
    from pipelines.serve.client import TritonClient

    settings = load_settings()
    gateway.up(settings)
    router = gateway.Router(settings)
    target = router.resolve("champion")
    bodies = _requests(args.requests)
    prepared = []
    for body in bodies:  # the direct path's prompts, built as the gateway builds them (untimed)
        served = api.request_row(api.parse_request(json.dumps(body).encode()))
        prepared.append((router.turns(target, served.row), served.row["tools_json"]))
    jobs_direct = [{"turns": t, "tools": tools} for t, tools in prepared]
    key = gateway.api_key(settings)

    local = threading.local()  # one connection per worker thread on both paths, as the gateway keeps its own

    def direct(job: dict[str, Any]) -> dict[str, Any]:
        if not hasattr(local, "triton"):
            local.triton = TritonClient(settings, timeout_s=settings.gateway.request_timeout_s)
        reply = local.triton.infer_one(
            target.name, job["turns"], job["tools"] if settings.triton.constrained else None, stream=True
        )
        return {"ms": reply.latency_ms, "error": reply.error, "ttft_ms": reply.first_token_ms}

    def through_gateway(stream: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
        def one(body: dict[str, Any]) -> dict[str, Any]:
            if not hasattr(local, "openai"):
                local.openai = OpenAI(
                    base_url=gateway.base_url(settings),
                    api_key=key,
                    timeout=settings.gateway.request_timeout_s,
                    max_retries=0,
                )
            client = local.openai
            t0 = time.perf_counter()
            first = named = None
            try:
                if stream:
                    for chunk in client.chat.completions.create(**body, stream=True):
                        at = (time.perf_counter() - t0) * 1000
                        first = first if first is not None or not chunk.choices else at
                        if named is None and any(
                            d.function and d.function.name for c in chunk.choices for d in c.delta.tool_calls or []
                        ):
                            named = at
                else:
                    client.chat.completions.create(**body)
                error = None
            except Exception as exc:  # noqa: BLE001 (counted, with its type)
                error = f"{type(exc).__name__}: {str(exc)[:120]}"
            return {"ms": (time.perf_counter() - t0) * 1000, "error": error, "ttft_ms": first, "name_ms": named}

        return one

    runs = []
    for level in [int(c) for c in args.concurrency.split(",")]:
        runs.append(_run("Triton direct (tritonclient, streamed)", level, jobs_direct, direct))
        runs.append(_run("gateway (openai client)", level, bodies, through_gateway(False)))
        runs.append(_run("gateway streamed (openai client)", level, bodies, through_gateway(True)))
        for r in runs[-3:]:
            print(json.dumps(r))
    one = {r["path"]: r for r in runs if r["concurrency"] == 1}
    direct_label = "Triton direct (tritonclient, streamed)"
    overhead = (
        round(one["gateway (openai client)"]["p50_ms"] - one[direct_label]["p50_ms"], 1)
        if one.get("gateway (openai client)", {}).get("p50_ms") and one.get(direct_label, {}).get("p50_ms")
        else None
    )
    ttft_overhead = (
        round(one["gateway streamed (openai client)"]["ttft_p50_ms"] - one[direct_label]["ttft_p50_ms"], 1)
        if one.get("gateway streamed (openai client)", {}).get("ttft_p50_ms")
        and one.get(direct_label, {}).get("ttft_p50_ms")
        else None
    )
    result = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": target.name,
        "constrained": settings.triton.constrained,
        "requests": len(bodies),
        "runs": runs,
        "gateway_overhead_p50_ms_c1": overhead,
        "gateway_ttft_overhead_p50_ms_c1": ttft_overhead,
        "note": "TTFT: direct, the first streamed text from Triton; through the gateway, the first SSE chunk "
        "(sent with the first token); name_p50_ms: the chunk naming the tool",
    }
    out = REPO / "bench" / "results" / "gateway.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"gateway overhead at concurrency 1 (p50): {overhead} ms, on TTFT: {ttft_overhead} ms; written {out}")


if __name__ == "__main__":
    main()
