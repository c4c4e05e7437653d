"""Two AI projects on one platform, end to end from an empty root, then a noisy neighbour.

1. `shop` (generated commerce traffic) and `search` (the public WebShop instruction -> query pairs, data
   nobody here wrote) are created, each with its own gateway key; `carol` is a viewer of `shop`.
2. Each project's logs land in its own raw zone and each runs the whole DAG (`flywheel --project P run
   --source landed`): prep, gates, features, sweep, evaluation, registry, promotion, Triton deploy.
3. `flywheel up` (MLflow with auth, Airflow, the gateway) serves both champions on one Triton server. With the
   `openai` client: shop's key lists and gets shop's champion and is refused search's model; search's key the
   same the other way; carol reads shop's runs through MLflow's REST API and not search's.
4. Noisy neighbour: `search` sends requests one after another (one client, its own WebShop requests) for
   `--seconds` in four phases: alone; while `shop` floods (`--flood` clients back to back) with no quota and
   the gateway's queue off (`gateway.backend_slots 0`: first come, first served at Triton, the gateway
   restarted for it); the same flood with the gateway's fair turns (its default: `gateway.backend_slots`
   completions at the model, unset: one per Triton instance on CPU; a freed one to the project with fewest there,
   pipelines/admission/fair.py); while
   `shop` floods under a quota (`--flood-rpm` requests a minute, one in flight). Every request of both
   projects is counted by outcome; search's latency per phase with a bootstrap 95 % interval, and its median
   ratio to the alone phase with its interval.
5. Drift in shop retrains shop only: drifted traffic lands in shop's raw zone, `drift_monitor__shop` is
   triggered through Airflow's REST API, and the asset it emits starts `commerce_flywheel__shop`; no
   `commerce_flywheel__search` run starts. Waits for that retrain to end (`--retrain-timeout`).

Usage: .venv/bin/python bench/projects.py [--work /tmp/w/projects] [--seconds 60] [--flood 6]
Writes bench/results/projects.json (commit, settings, seeds, every count) and its page projects.html (plots:
bench/projects_report.py) and prints a summary; with `--multi-lora` (every version an adapter on one shared
base, `triton.multi_lora`) projects_multi_lora.json and .html.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from projects_checks import (  # noqa: E402 (after sys.path gains bench/)
    DAY,
    SEED,
    airflow_isolation,
    drift_retrains_only_its_project,
    isolation,  # noqa: E402
    requests_of,
    triton_models,
)
from real_data import commit, flywheel  # noqa: E402 (one way to run the CLI as a user would)

WEBSHOP = (
    Path(os.environ.get("FLYWHEEL_SHARED", REPO.parent / "shared"))
    / "data"
    / "webshop"
    / "instruction_to_query.dev.json"
)


def _bootstrap(values: list[float], stat, n: int = 2000, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    draws = sorted(stat([rng.choice(values) for _ in values]) for _ in range(n))
    return [round(draws[int(0.025 * n)], 1), round(draws[int(0.975 * n) - 1], 1)]


def _p95(values: list[float]) -> float:
    return sorted(values)[max(0, int(round(0.95 * len(values))) - 1)]


class Caller:
    """One closed-loop client of the gateway: every request counted by outcome, its latency kept."""

    def __init__(self, url: str, key: str, requests: list[dict[str, Any]], model: str = "champion") -> None:
        import httpx

        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=180)
        self.requests, self.model = requests, model
        self.outcomes: Counter[str] = Counter()
        self.latencies_ms: list[float] = []

    def run(self, stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            body = {**self.requests[i % len(self.requests)], "model": self.model}
            i += 1
            started = time.perf_counter()
            try:
                response = self.http.post("/chat/completions", json=body)
            except Exception as exc:  # noqa: BLE001 (counted: a transport error or the client's timeout)
                self.outcomes[f"error:{type(exc).__name__}"] += 1
                stop.wait(1.0)  # no busy loop against a gateway that is gone
                continue
            elapsed = (time.perf_counter() - started) * 1000
            self.outcomes[str(response.status_code)] += 1
            if response.status_code == 200:
                self.latencies_ms.append(elapsed)
            elif response.status_code == 429:  # as the openai SDK does: wait what the gateway says (capped)
                stop.wait(min(float(response.headers.get("retry-after") or 1), 2.0))


def _watch_queue(url: str, key: str, stop: threading.Event, samples: list[dict[str, Any]]) -> None:
    import httpx

    while not stop.wait(2.0):
        try:
            answer = httpx.get(url + "/gateway/queue", headers={"Authorization": f"Bearer {key}"}, timeout=5)
            samples.append(answer.json() if answer.status_code == 200 else {"status": answer.status_code})
        except (httpx.HTTPError, ValueError) as exc:
            samples.append({"error": type(exc).__name__})


def _queue_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [s for s in samples if "busy" in s]
    if not ok:
        return {"samples": len(samples), "answered": 0}
    first, last = ok[0], ok[-1]
    return {
        "samples": len(samples),
        "answered": len(ok),
        "slots": last.get("slots"),
        "contended_share": round(sum(bool(s.get("contended")) for s in ok) / len(ok), 2),
        "busy_max": max(s["busy"] for s in ok),
        "waiting_max": max(s["waiting"] for s in ok),
        "busy_median": statistics.median(s["busy"] for s in ok),
        # the gateway's counts are totals since it started: the phase's are the first and last samples' gap
        **{
            f"{k}_in_phase": (last.get(k) or 0) - (first.get(k) or 0)
            for k in ("granted", "waited", "timed_out", "refused_places")
        },
    }


def phase(
    url: str,
    keys: dict[str, str],
    reqs: dict[str, list[dict[str, Any]]],
    seconds: float,
    flood: int,
    admin_key: str | None = None,
) -> dict[str, Any]:
    stop = threading.Event()
    quiet = Caller(url, keys["search"], reqs["search"])
    floods = [Caller(url, keys["shop"], reqs["shop"][i :: max(flood, 1)] or reqs["shop"]) for i in range(flood)]
    threads = [threading.Thread(target=c.run, args=(stop,)) for c in [quiet, *floods]]
    samples: list[dict[str, Any]] = []
    if admin_key:  # the gateway's turns, every 2 s, with the operator's key (what a person would watch)
        threads.append(threading.Thread(target=_watch_queue, args=(url, admin_key, stop, samples)))
    return {
        **run_phase(threads, stop, seconds, quiet, floods),
        "gateway_queue": _queue_summary(samples) if admin_key else None,
    }


def run_phase(
    threads: list[threading.Thread], stop: threading.Event, seconds: float, quiet: Caller, floods: list[Caller]
) -> dict[str, Any]:
    """The phase's threads run for `seconds` (then each caller ends its request in flight); search's answers
    (every latency, the median with its bootstrap interval) and every outcome of both projects."""
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=240)
    lat = quiet.latencies_ms
    shop: Counter[str] = sum((c.outcomes for c in floods), Counter())
    return {
        "search": {
            "outcomes": dict(quiet.outcomes),
            "n": len(lat),
            "p50_ms": round(statistics.median(lat), 1) if lat else None,
            "p50_ci95": _bootstrap(lat, statistics.median) if len(lat) > 2 else None,
            "p95_ms": round(_p95(lat), 1) if lat else None,
            "latencies_ms": [round(x, 1) for x in lat],
        },
        "shop": {"outcomes": dict(shop), "clients": len(floods), "answered": sum(len(c.latencies_ms) for c in floods)},
    }


def restart_gateway(step: Any, url: str, slots: int | None, admin_key: str) -> None:
    """The gateway stopped and started again with `gateway.backend_slots` = slots (None: the settings'), then
    waited for until it is ready and its turns have that many slots (every wait bounded)."""
    import httpx

    step(f"gateway_down_{slots}", "gateway", "down", timeout_s=120)
    if slots is None:
        os.environ.pop("FLYWHEEL_GATEWAY__BACKEND_SLOTS", None)
    else:
        os.environ["FLYWHEEL_GATEWAY__BACKEND_SLOTS"] = str(slots)
    step(f"gateway_up_{slots}", "gateway", "up", timeout_s=300)
    deadline = time.monotonic() + 180
    while True:
        try:
            ready = httpx.get(url.removesuffix("/v1") + "/ready", timeout=10)
            queue = httpx.get(url + "/gateway/queue", headers={"Authorization": f"Bearer {admin_key}"}, timeout=10)
            turns = queue.json() if queue.status_code == 200 else {}
            if ready.status_code == 200 and "slots" in turns and (slots is None or turns["slots"] == slots):
                print(f"  gateway turns: {turns}", flush=True)
                return
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"error: the gateway was not ready with backend_slots={slots} within 180 s")
        time.sleep(2)


def ratios(phases: dict[str, Any]) -> dict[str, Any]:
    """Search's median latency in each flood phase over its median alone, and under fair turns over first come
    first served, each with a bootstrap 95 % interval (independent samples; at least 3 answers on each side)."""

    def ratio(base: str, name: str, key: str) -> None:
        a, b = phases[base]["search"]["latencies_ms"], phases[name]["search"]["latencies_ms"]
        if len(a) > 2 and len(b) > 2:
            phases[name]["search"][f"p50_ratio_to_{key}"] = round(statistics.median(b) / statistics.median(a), 2)
            # (the interval to alone keeps the name earlier results files and the page use)
            phases[name]["search"]["p50_ratio_ci95" if key == "alone" else f"p50_ratio_to_{key}_ci95"] = ratio_ci(a, b)

    for name in ("flood_fifo", "flood_no_quota", "flood_quota"):
        if name in phases:
            ratio("alone", name, "alone")
    if "flood_fifo" in phases:
        ratio("flood_fifo", "flood_no_quota", "fifo")
    return phases


def ratio_ci(a: list[float], b: list[float], seed: int = 0, n: int = 2000) -> list[float]:
    """Bootstrap 95 % interval of median(b) / median(a) (independent samples)."""
    rng = random.Random(seed)
    draws = sorted(
        statistics.median([rng.choice(b) for _ in b]) / statistics.median([rng.choice(a) for _ in a]) for _ in range(n)
    )
    return [round(draws[int(0.025 * n)], 2), round(draws[int(0.975 * n) - 1], 2)]


def main() -> int:  # noqa: PLR0915 (one scenario, told in order)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="default /tmp/w/projects[_multi_lora][_multi_team] (a --skip-runs re-run never mixes deployments)",
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--flood", type=int, default=6)
    parser.add_argument("--flood-rpm", type=int, default=6)
    parser.add_argument("--records", type=int, default=1500)
    parser.add_argument("--retrain-timeout", type=float, default=2400.0)
    parser.add_argument(
        "--skip-runs",
        action="store_true",
        help="reuse a root whose two DAG runs are done (the "
        "results of the earlier steps are kept from bench/results/projects.json)",
    )
    parser.add_argument("--skip-drift", action="store_true", help="stop after the noisy neighbour")
    parser.add_argument(
        "--skip-fifo",
        action="store_true",
        help="no first-come-first-served phase (it restarts "
        "the gateway with gateway.backend_slots 0, then again with the settings')",
    )
    parser.add_argument(
        "--multi-lora",
        action="store_true",
        help="triton.multi_lora on: every project's versions "
        "deploy as adapters on one shared base model (results: projects_multi_lora.json)",
    )
    parser.add_argument(
        "--multi-team",
        action="store_true",
        help="airflow.multi_team on: each project an Airflow "
        "team; isolation also checks carol's Airflow login (results: ..._multi_team.json). The "
        "platform's default (auto) turns it on with the first project; without this flag the bench "
        "sets it off, as its first runs had it",
    )
    args = parser.parse_args()
    # every flywheel command (and every server `up` starts) reads it; the flag alone decides, not the shell
    os.environ["FLYWHEEL_TRITON__MULTI_LORA"] = "true" if args.multi_lora else "false"
    os.environ["FLYWHEEL_AIRFLOW__MULTI_TEAM"] = "true" if args.multi_team else "false"
    name = "projects" + ("_multi_lora" if args.multi_lora else "") + ("_multi_team" if args.multi_team else "")
    if args.work is None:
        args.work = Path(f"/tmp/w/{name}")

    root = args.work / "root"
    log = args.work / "projects.log"
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.update({"FLYWHEEL_ROOT": str(root)})
    result: dict[str, Any] = {
        "bench": "projects",
        "commit": commit(),
        "day": DAY,
        "seed": SEED,
        "settings": vars(args) | {"work": str(args.work)},
        "steps": {},
    }
    timings = result["steps"]
    out_file = REPO / "bench" / "results" / f"{name}.json"
    if args.skip_runs and out_file.is_file():  # a re-run of the later steps keeps the earlier ones' results
        earlier = json.loads(out_file.read_text())
        result = {
            **earlier,
            **{k: result[k] for k in ("commit", "settings")},
            "earlier_commit": earlier.get("commit"),
            "steps": {**earlier.get("steps", {})},
        }
        timings = result["steps"]

    def step(name: str, *cmd: str, timeout_s: float | None = None) -> str:
        started = time.perf_counter()
        out = flywheel(root, *cmd, log=log, timeout_s=timeout_s)
        timings[name] = round(time.perf_counter() - started, 1)
        return out

    keys_file = args.work / "keys.json"  # the keys are shown once: kept for a --skip-runs re-run (0600)
    if not args.skip_runs:
        step("create_shop", "project", "create", "shop", "--owner", "alice")
        step("create_search", "project", "create", "search", "--owner", "bob")
        step("viewer", "project", "members", "shop", "add", "carol", "--role", "viewer")
        keys = {
            p: json.loads(step(f"key_{p}", "project", "key", "create", p, "--json"))["key"] for p in ("shop", "search")
        }
        keys_file.touch(mode=0o600)
        keys_file.chmod(0o600)
        keys_file.write_text(json.dumps(keys))
        step(
            "logs_shop",
            "--project",
            "shop",
            "logs",
            "generate",
            "--records",
            str(args.records),
            "--end-date",
            DAY,
            "--days",
            "1",
            "--seed",
            str(SEED),
        )
        step("logs_search", "--project", "search", "logs", "import-webshop", str(WEBSHOP), "--date", DAY)
        for p in ("shop", "search"):
            result[f"run_{p}"] = json.loads(
                step(
                    f"run_{p}",
                    "--project",
                    p,
                    "run",
                    "--end-date",
                    DAY,
                    "--window-days",
                    "1",
                    "--source",
                    "landed",
                    "--json",
                )
            )
    keys = json.loads(keys_file.read_text())
    up = json.loads(step("up", "up", "--paused", "--json", timeout_s=900))
    url = up["gateway"]["url"]
    try:
        result["isolation"] = isolation(url, keys, root)
        if args.multi_team:
            result["isolation"]["airflow"] = airflow_isolation(root)
        try:
            result["triton"] = triton_models(root)
        except Exception as exc:  # noqa: BLE001 (a diagnostic: recorded, the phases go on)
            result["triton"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result["triton"], indent=1), flush=True)
        print(json.dumps(result["isolation"], indent=1), flush=True)
        from pipelines.config import load_settings
        from pipelines.projects import settings_for

        platform = load_settings(root=str(root))
        from pipelines.admission.fair import backend_slots

        result["settings"]["gateway_backend_slots"] = backend_slots(platform)  # the fair turns' slots
        reqs = {p: requests_of(Path(settings_for(platform, p).zone("raw")), 200, SEED) for p in ("shop", "search")}
        phases = {}
        admin = (root / "runs" / "gateway.key").read_text().strip()  # the operator's key: the queue's figures
        step("no_quota", "project", "quota", "shop", "--rpm", "0", "--concurrent", "0", "--tokens-per-day", "0")
        time.sleep(2)
        phases["alone"] = phase(url, keys, reqs, args.seconds, 0, admin)
        if not args.skip_fifo:
            restart_gateway(step, url, 0, admin)  # the gateway's queue off: Triton's first come, first served
            try:
                phases["flood_fifo"] = phase(url, keys, reqs, args.seconds, args.flood, admin)
            finally:
                restart_gateway(step, url, None, admin)  # back to the settings' fair turns
        phases["flood_no_quota"] = phase(url, keys, reqs, args.seconds, args.flood, admin)
        step("quota", "project", "quota", "shop", "--rpm", str(args.flood_rpm), "--concurrent", "1")
        time.sleep(2)  # the gateway re-reads the registry within a second
        phases["flood_quota"] = phase(url, keys, reqs, args.seconds, args.flood, admin)
        result["noisy_neighbour"] = ratios(phases)
        print(
            json.dumps(
                {
                    k: {kk: {x: y for x, y in vv.items() if x != "latencies_ms"} for kk, vv in v.items()}
                    for k, v in phases.items()
                },
                indent=1,
            ),
            flush=True,
        )
        if not args.skip_drift:
            result["drift"] = drift_retrains_only_its_project(root, args, step, log)
    finally:
        out_file.write_text(json.dumps(result, indent=2) + "\n")  # before `down`, which may fail
        print(f"wrote {out_file}", flush=True)
        try:  # the page a person reads (bench/projects_report.py renders it again from the JSON)
            from projects_report import write

            print(f"wrote {write(result, out_file)}", flush=True)
        except Exception as exc:  # noqa: BLE001 (the JSON is written; the page can be rendered later)
            print(
                f"the HTML page was not written ({type(exc).__name__}: {exc}); run bench/projects_report.py {out_file}",
                flush=True,
            )
        step("down", "down", timeout_s=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
