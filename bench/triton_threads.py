"""Instances x torch threads of the served model: which Triton layout answers best on this machine.

The live champion of a root (its adapter, prompt style and test-split requests, constrained decoding as
served) is written into a scratch model repository once per layout (`triton.instances` model instances,
`triton.threads` torch threads each; 0 = torch's default, the cores) and served by a scratch Triton
server on free loopback ports, so the root's own server and deployment are not touched. Each layout
answers the same requests, streamed, at each concurrency; every request counts (an error is a latency
sample at the time it took, and an `errors` column). Reported: TTFT, inter-token latency, p50/p95
latency, requests/s.

Usage (a root where `make demo` ran: a live champion):
  FLYWHEEL_ROOT=.flywheel .venv/bin/python bench/triton_threads.py [--requests 16] [--concurrency 1,2,4]
      [--layouts 1x0,1x1,2x1]
Writes bench/results/triton_threads.json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--layouts", default="1x0,1x1,2x1", help="instances x threads, comma-separated")
    args = parser.parse_args()
    layouts = []
    for item in args.layouts.split(","):
        found = re.fullmatch(r"(\d+)x(\d+)", item.strip())
        if not found:
            raise SystemExit(f"error: --layouts: expected INSTANCESxTHREADS such as 2x1, got {item!r}")
        layouts.append((int(found.group(1)), int(found.group(2))))

    from pipelines.bench.results import summarize_run
    from pipelines.config import load_settings
    from pipelines.hardware import detect
    from pipelines.serve import deploy, repository
    from pipelines.serve.client import TritonClient
    from pipelines.serve.prompts import conversation
    from pipelines.services import free_port
    from pipelines.stack import triton as server

    settings = load_settings()
    live = deploy.live_model(settings)
    if live is None:
        raise SystemExit("error: no live model in this root: run `make demo` (or `flywheel deploy`) first")
    source = Path(repository.model_uri(settings, live.name))
    config = (source / "config.pbtxt").read_text()
    base_path = re.search(r'key: "base_model_path" value: \{ string_value: "([^"]+)"', config).group(1)
    adapter = source / "1" / "adapter"
    rows = deploy.smoke_rows(settings, args.requests)
    conversations = [conversation(r, live.prompt_style) for r in rows]
    tools = [r["tools_json"] for r in rows] if settings.triton.constrained else None
    levels = [int(c) for c in args.concurrency.split(",")]

    scratch = Path(tempfile.mkdtemp(prefix="triton-threads-"))
    ports = {"http_port": free_port(), "grpc_port": free_port(), "metrics_port": free_port()}
    probe = settings.model_copy(
        update={
            "root": str(scratch),
            "triton": settings.triton.model_copy(
                update={**ports, "model_repository": str(scratch / "model_repository")}
            ),
        }
    )
    runs = []
    started = time.perf_counter()
    try:
        server.up(probe)
        for instances, threads in layouts:
            layout = probe.model_copy(
                update={"triton": probe.triton.model_copy(update={"instances": instances, "threads": threads})}
            )
            name = f"probe_{instances}x{threads}"
            repository.write_model(
                layout,
                scratch / "model_repository",
                name,
                base_path,
                str(adapter) if adapter.is_dir() else None,
                {
                    "registry_version": live.version,
                    "base_model": "probe",
                    "prompt_style": live.prompt_style,
                    "model": name,
                },
            )
            client = TritonClient(layout, "grpc", timeout_s=settings.gateway.request_timeout_s)
            try:
                t0 = time.perf_counter()
                client.load(name)
                load_s = round(time.perf_counter() - t0, 1)
                client.infer(
                    name, conversations[:instances], concurrency=instances, tools=tools[:instances] if tools else None
                )  # warm-up: every instance once
                for level in levels:
                    t0 = time.perf_counter()
                    replies = client.infer(name, conversations, concurrency=level, tools=tools, stream=True)
                    run = summarize_run(
                        f"{instances} instance(s) x {threads or 'default'} thread(s)",
                        level,
                        rows,
                        replies,
                        time.perf_counter() - t0,
                        client.timeout_s * 1000,
                    )
                    run.update(instances=instances, threads=threads, load_s=load_s)
                    runs.append(run)
                    print(
                        json.dumps(
                            {
                                k: run[k]
                                for k in (
                                    "model",
                                    "concurrency",
                                    "errors",
                                    "ttft_ms",
                                    "itl_ms",
                                    "p50_ms",
                                    "p95_ms",
                                    "requests_per_s",
                                )
                            }
                        ),
                        flush=True,
                    )
                client.unload(name, wait_s=120)
            finally:
                client.close()
    finally:
        server.down(probe)
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "live": live.name,
        "requests": len(rows),
        "constrained": tools is not None,
        "hardware": detect(settings.bench.hardware).__dict__,
        "runs": runs,
        "seconds": round(time.perf_counter() - started, 1),
        "note": "every request streamed; TTFT and ITL are medians; threads 0 = torch's default (the cores)",
    }
    out = REPO / "bench" / "results" / "triton_threads.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
