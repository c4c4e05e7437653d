"""The gateway at several times what it admits: every request is answered or refused at once with a 429,
the probes keep answering, and no answered turn is lost.

`--factor` (4) x `gateway.max_concurrent_requests` clients send requests back to back for `--seconds`
(generated shopper turns under our tools, as AIPerf replays them), through httpx with no retries so every
429 is seen (a refused client waits its `Retry-After`, as the openai SDK would, then sends its next
request), while a prober calls `/livez` and `/ready` every half second. Every request is counted by
its outcome: answered (200), refused (429, with its `Retry-After`), another status, or no response (a
transport error or the client's timeout). Then each answered request's id is looked up among the turns the
gateway captured (the raw zone for labels, `serving/gateway/unusable/` for cut or free-text answers):
answered but found in neither is lost, and must be 0.

Usage (a root where `make demo` ran; the gateway and Triton are started from its serving state):
  FLYWHEEL_ROOT=<root> .venv/bin/python bench/overload.py [--factor 4] [--seconds 60]
Writes bench/results/overload.json (commit, settings, seed, every count, latencies by outcome).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))


def _captured_ids(settings: Any) -> set[str]:
    """Every record id the gateway wrote: labels in the raw zone, cut or free answers apart."""
    ids: set[str] = set()
    folders = [Path(settings.zone("raw")), Path(settings.zone("serving")) / "gateway" / "unusable"]
    for path in [p for folder in folders for p in folder.glob("dt=*/gateway-*.jsonl")]:
        for line in path.read_bytes().splitlines():
            try:
                ids.add(json.loads(line)["record_id"])
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line of a killed writer: not ours to count here
    return ids


def _retry_after_s(value: str | None) -> float:
    """A `Retry-After` in seconds; 1 s for one that is missing, an HTTP date or not a usable number."""
    try:
        seconds = float(value or 1)
    except ValueError:
        return 1.0
    return min(seconds, 5.0) if seconds >= 0 else 1.0  # NaN fails the comparison too


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--factor", type=int, default=4, help="clients per admitted request in flight")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--turns", type=int, default=64, help="distinct generated turns, sent round-robin")
    args = parser.parse_args()

    import httpx
    from gateway import _requests
    from real_data import commit

    from pipelines.bench.results import percentile
    from pipelines.config import load_settings
    from pipelines.gateway import app as gateway
    from pipelines.serve import deploy

    settings = load_settings()
    if str(settings.root).startswith(("s3://", "s3a://", "gs://", "abfss://")):
        print(
            f"error: root {settings.root} is on object storage: the captured turns are read from a local root",
            file=sys.stderr,
        )
        return 2
    if not settings.gateway.capture:
        print("error: gateway.capture is off: no answered turn could be found captured", file=sys.stderr)
        return 2
    if deploy.live_model(settings) is None:
        print(f"error: no live model under {settings.root}: run `make demo` first", file=sys.stderr)
        return 2
    admitted = settings.gateway.max_concurrent_requests
    clients = args.factor * admitted
    bodies = _requests(args.turns)
    timeout = settings.gateway.request_timeout_s + 30
    step = "deploy.restore"
    try:
        deploy.restore(settings)  # Triton with the live and previous models, as `flywheel up --only gateway` does
        step = "gateway.up"
        gateway.up(settings)
        step = "the gateway's URL and key"
        base, key = gateway.base_url(settings), gateway.api_key(settings)
        headers = {"Authorization": f"Bearer {key}"}
        step = "the warm-up request"
        with httpx.Client(timeout=timeout, headers=headers) as warm:  # the first grammar build, untimed
            warm.post(f"{base}/chat/completions", json=bodies[0]).raise_for_status()
    except Exception as exc:  # DeployFailed, ServiceError, ConfigError, httpx errors: one line, not a traceback
        print(f"error: {step}: {_one_line(exc)}", file=sys.stderr)
        return 2

    stop = time.monotonic() + args.seconds
    lock = threading.Lock()
    outcomes: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []

    def client(n: int) -> None:
        with httpx.Client(timeout=timeout, headers=headers) as http:
            i = n
            while time.monotonic() < stop:
                body = bodies[i % len(bodies)]
                i += clients
                t0 = time.perf_counter()
                try:
                    response = http.post(f"{base}/chat/completions", json=body)
                    row = {
                        "status": response.status_code,
                        "ms": (time.perf_counter() - t0) * 1000,
                        "retry_after": response.headers.get("retry-after"),
                        "id": response.json().get("id") if response.status_code == 200 else None,
                    }
                except Exception as exc:  # transport, timeout, or a 200 that is not JSON: the thread keeps counting
                    row = {"status": None, "ms": (time.perf_counter() - t0) * 1000, "error": type(exc).__name__}
                with lock:
                    outcomes.append(row)
                if row["status"] == 429:  # a well-behaved client (the openai SDK does) waits as it is told
                    time.sleep(_retry_after_s(row["retry_after"]))

    def prober() -> None:
        root = base.removesuffix("/v1")
        with httpx.Client(timeout=5) as http:
            while time.monotonic() < stop:
                for path in ("/livez", "/ready"):
                    t0 = time.perf_counter()
                    try:
                        status = http.get(f"{root}{path}").status_code
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    probes.append({"path": path, "status": status, "ms": (time.perf_counter() - t0) * 1000})
                time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(clients)]
    threads.append(threading.Thread(target=prober, daemon=True))
    started = time.perf_counter()
    print(f"{clients} clients against a gateway admitting {admitted} for {args.seconds:.0f} s ...", flush=True)
    for t in threads:
        t.start()
    deadline = time.monotonic() + args.seconds + timeout + 60  # one for all threads, not one each
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    wall = time.perf_counter() - started
    hung = sum(t.is_alive() for t in threads)
    time.sleep(2)  # the capture is fsynced before each answer leaves; this only lets the file listing settle

    by_status = Counter("no response" if o["status"] is None else str(o["status"]) for o in outcomes)
    answered = [o for o in outcomes if o["status"] == 200]
    refused = [o for o in outcomes if o["status"] == 429]
    captured = _captured_ids(settings)
    lost = [o["id"] for o in answered if o["id"] not in captured]

    def latency(rows: list[dict[str, Any]]) -> dict[str, float | None]:
        values = [r["ms"] for r in rows]
        return {
            "p50_ms": percentile(values, 50) if values else None,
            "p99_ms": percentile(values, 99) if values else None,
            "max_ms": round(max(values), 1) if values else None,
        }

    probe_rows = {path: [p for p in probes if p["path"] == path] for path in ("/livez", "/ready")}
    probe_ok = {"/livez": (200,), "/ready": (200, 503)}  # not ready is an answer under load; not alive is not
    refused_p99 = latency(refused)["p99_ms"]
    result = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "settings": {
            "factor": args.factor,
            "clients": clients,
            "admitted": admitted,
            "seconds": args.seconds,
            "turns": args.turns,
            "turns_seed": 41,
            "constrained": settings.triton.constrained,
            "request_timeout_s": settings.gateway.request_timeout_s,
        },
        "model": deploy.live_model(settings).name,
        "wall_s": round(wall, 1),
        "requests": len(outcomes),
        "by_status": dict(sorted(by_status.items())),
        "answered": len(answered),
        "refused_429": len(refused),
        "refused_without_retry_after": sum(1 for o in refused if not o["retry_after"]),
        "other_status_or_no_response": len(outcomes) - len(answered) - len(refused),
        "answered_per_s": round(len(answered) / wall, 3),
        "latency": {"answered": latency(answered), "refused_429": latency(refused)},
        "refused_at_once": refused_p99 is None or refused_p99 < 1000,
        "answered_not_captured": len(lost),
        "lost_examples": lost[:5],
        "client_threads_still_running": hung,
        "probes": {
            path: {
                "n": len(rows),
                "ok": sum(1 for r in rows if r["status"] in probe_ok[path]),
                "failed": [r["status"] for r in rows if r["status"] not in probe_ok[path]][:5],
                "ready_200": sum(1 for r in rows if r["status"] == 200),
                **latency(rows),
            }
            for path, rows in probe_rows.items()
        },
    }
    out = REPO / "bench" / "results" / "overload.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "requests",
                    "by_status",
                    "answered_per_s",
                    "answered_not_captured",
                    "latency",
                    "refused_at_once",
                    "probes",
                )
            },
            indent=1,
        )
    )
    print(f"written {out}")
    healthy = all(not v["failed"] for v in result["probes"].values())
    ok = not lost and not hung and healthy and result["refused_at_once"] and result["other_status_or_no_response"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
