"""Fair turns across two gateway replicas: a quiet project's latency while another floods through the OTHER replica.

The cluster runs two gateway replicas and its balancer spreads connections, not projects: the worst case is a
flood that reaches one replica only while the quiet project's requests go through the other. Each replica
keeps its own turns at the shared model (`pipelines/admission/fair.py`); `gateway.turns_exchange_s` (5 s) has
them tell each other which projects send and their demand (`pipelines/admission/peers.py`), 0 keeps each alone.

Set-up (real components, no DAG run: the adapters are random rank-16 ones, a trained adapter's shape and cost):
one Triton server with the SmolLM2-135M base loaded once (`triton.multi_lora`, `--instances`, one thread), two
projects `shop` and `search` each with its champion an adapter on that base (serving state written as a deploy
writes it), a key each; two real gateway processes (`python -m pipelines.gateway`, replicas gw-a and gw-b, one
root). search (one client, one request after another, the public WebShop instructions: data nobody here
wrote) always goes through gw-a; shop's `--flood` clients (generated commerce turns, back to back, each waits
what a 429's Retry-After says, at most 2 s) through `--flood-through` (gw-b; gw-b,gw-a: in turn).

Phases, `--seconds` each: search alone (exchange on); then `--rounds` rounds of the flood with the exchange off
(`alone_turns`: each replica keeps its own turns, what the platform did before) and on (`shared_turns`), their
order alternating between rounds, both gateways restarted for each. Every request of both projects is counted
by outcome; search's answered latencies pooled per arm, the median ratio shared / alone-turns with a bootstrap
95 % interval (independent samples) and per round; both gateways' turns sampled every 2 s.

Usage: .venv/bin/python bench/fair_replicas.py [--work /tmp/w/fair_replicas] [--seconds 50] [--rounds 3] [--flood 6]
       [--instances 1] [--flood-through gw-b]   (--instances 2 --flood-through gw-b,gw-a: the slots split by demand)
Writes bench/results/fair_replicas.json (commit, settings, seeds, every count) and fair_replicas.html; prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from projects import Caller, _queue_summary, _watch_queue, ratio_ci, run_phase  # noqa: E402
from real_data import commit  # noqa: E402

WEBSHOP = (
    Path(os.environ.get("FLYWHEEL_SHARED", REPO.parent / "shared"))
    / "data"
    / "webshop"
    / "instruction_to_query.dev.json"
)
BASE_MODEL = "smollm2-135m-instruct"
REPLICAS = ("gw-a", "gw-b")


def requests_for(seed: int) -> dict[str, list[dict[str, Any]]]:
    """search: WebShop instructions as the user's turn, with the generated traffic's product-search tools and
    system turn; shop: generated commerce turns (every tool family)."""
    import random

    from pipelines.bench.aiperf import trace_lines

    shop = [
        {"messages": t["messages"], "tools": t["tools"], "user": t["extra"]["user"]} for t in trace_lines(400, seed)
    ]
    search_like = next(t for t in shop if any(x["function"]["name"] == "search_products" for x in t["tools"]))
    instructions = list(json.loads(WEBSHOP.read_text()))
    random.Random(seed).shuffle(instructions)
    system = search_like["messages"][0]
    search = [
        {
            "messages": [system, {"role": "user", "content": str(text)[:400]}],
            "tools": search_like["tools"],
            "user": "anonymous",
        }
        for text in instructions[:400]
    ]
    return {"search": search, "shop": shop}


def set_up(work: Path, new_tokens: int, seed: int, instances: int = 1) -> tuple[Any, dict[str, str], Any]:
    """(settings, keys, Triton status): the shared base loaded with both projects' champions as adapters."""
    from pipelines.base_models import prepare_base
    from pipelines.bench.adapters import make_adapters
    from pipelines.config import load_settings
    from pipelines.gateway.app import api_key
    from pipelines.projects import registry, settings_for
    from pipelines.serve import shared_base
    from pipelines.serve.client import TritonClient
    from pipelines.services import free_port
    from pipelines.stack import triton as server
    from pipelines.storage import write_json

    shutil.rmtree(work, ignore_errors=True)
    settings = load_settings(
        root=str(work),
        triton={
            "http_port": free_port(),
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "multi_lora": True,
            "max_adapters": 2,
            "max_new_tokens": new_tokens,
            "max_input_tokens": 1536,
            "threads": 1,
            "instances": instances,
        },
    )
    keys = {"default": api_key(settings)}
    base = prepare_base(BASE_MODEL, settings)
    names = {}
    for project in ("shop", "search"):
        registry.create(settings, project, "alice", registry.Quotas())
        keys[project] = registry.create_key(settings, project)[1]
        names[project] = f"{settings_for(settings, project).triton.model_name}_v1"
    folders = make_adapters(base, work / "adapters", list(names.values()), rank=16, alpha=32, seed=seed)
    shared = shared_base.build_shared(settings, BASE_MODEL, is_loaded=lambda _: False)
    for project, name in names.items():
        shared_base.write_adapter(
            settings,
            name,
            str(folders[name]),
            {"shared": shared.name, "prompt_style": "short", "base_model": BASE_MODEL, "registry_version": "1"},
        )
        write_json(
            f"{settings_for(settings, project).zone('serving')}/state.json",
            {"live": {"name": f"{shared.name}@{name}", "version": "1", "prompt_style": "short"}, "previous": None},
        )
    status = server.up(settings)
    client = TritonClient(settings, "grpc", timeout_s=300)
    try:
        client.load(shared.name)
    finally:
        client.close()
    return settings, keys, status


def start_gateways(settings: Any, ports: dict[str, int], exchange_s: float, work: Path) -> list[subprocess.Popen]:
    """The two replicas as real processes, each with its own settings file (the gateway reads and removes it)."""
    import httpx

    from pipelines.gateway import app as gateway_app

    procs = []
    for replica in REPLICAS:
        mine = settings.model_copy(
            update={
                "gateway": settings.gateway.model_copy(
                    update={"port": ports[replica], "replica": replica, "turns_exchange_s": exchange_s}
                )
            }
        )
        path = gateway_app._settings_file(mine)
        own = path.with_name(f"gateway-settings-{replica}.json")
        path.replace(own)
        env = {
            **os.environ,
            gateway_app.SETTINGS_ENV: str(own),
            "NO_PROXY": "127.0.0.1,localhost",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
        }
        log = open(work / f"{replica}.log", "ab")  # noqa: SIM115 (the process keeps it)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "pipelines.gateway"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
            )
        )
    deadline = time.monotonic() + 120
    for replica in REPLICAS:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{ports[replica]}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                stop_gateways(procs)
                raise SystemExit(f"error: gateway {replica} did not start (see {work / (replica + '.log')})")
            time.sleep(0.5)
    return procs


def stop_gateways(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


def warm(
    urls: dict[str, str],
    keys: dict[str, str],
    reqs: dict[str, list[dict[str, Any]]],
    projects: tuple[str, ...],
    flood_through: tuple[str, ...] = ("gw-b",),
) -> dict[str, int]:
    """One answer per project through its replica (the routing tables built, the adapters in the cache)."""
    import httpx

    out = {}
    for project, replica in [("search", "gw-a")] + [("shop", r) for r in flood_through]:
        if project not in projects:
            continue
        answer = httpx.post(
            urls[replica] + "/chat/completions",
            json={**reqs[project][0], "model": "champion"},
            headers={"Authorization": f"Bearer {keys[project]}"},
            timeout=300,
        )
        out[f"{project}@{replica}"] = answer.status_code
        if answer.status_code != 200:
            raise SystemExit(f"error: {project}'s warm-up through {replica}: {answer.status_code} {answer.text[:300]}")
    return out


def phase(
    urls: dict[str, str],
    keys: dict[str, str],
    reqs: dict[str, list[dict[str, Any]]],
    seconds: float,
    flood: int,
    offset: int,
    flood_through: tuple[str, ...] = ("gw-b",),
) -> dict[str, Any]:
    stop = threading.Event()
    quiet = Caller(urls["gw-a"], keys["search"], reqs["search"][offset:] + reqs["search"][:offset])
    floods = [
        Caller(urls[flood_through[i % len(flood_through)]], keys["shop"], reqs["shop"][offset + i :: max(flood, 1)])
        for i in range(flood)
    ]
    samples: dict[str, list[dict[str, Any]]] = {r: [] for r in REPLICAS}
    threads = [threading.Thread(target=c.run, args=(stop,)) for c in [quiet, *floods]]
    threads += [
        threading.Thread(target=_watch_queue, args=(urls[r], keys["default"], stop, samples[r])) for r in REPLICAS
    ]
    return {
        **run_phase(threads, stop, seconds, quiet, floods),
        "turns": {
            r: {
                **_queue_summary(samples[r]),
                "peers_seen": max((s.get("peers", 0) for s in samples[r] if "busy" in s), default=None),
                "waiting_median": statistics.median([s["waiting"] for s in samples[r] if "busy" in s] or [0]),
                "samples_raw": samples[r],
            }
            for r in REPLICAS
        },
    }


def summarize(phases: list[dict[str, Any]]) -> dict[str, Any]:
    pooled = {
        arm: [x for p in phases if p["arm"] == arm for x in p["search"]["latencies_ms"]]
        for arm in ("alone", "alone_turns", "shared_turns")
    }
    out: dict[str, Any] = {
        "search_n": {arm: len(v) for arm, v in pooled.items()},
        "search_p50_ms": {arm: round(statistics.median(v), 1) if v else None for arm, v in pooled.items()},
    }
    a, b = pooled["alone_turns"], pooled["shared_turns"]
    if len(a) > 2 and len(b) > 2:
        out["shared_over_alone_turns_p50"] = round(statistics.median(b) / statistics.median(a), 2)
        out["shared_over_alone_turns_ci95"] = ratio_ci(a, b)
    for arm in ("alone_turns", "shared_turns"):
        if len(pooled["alone"]) > 2 and len(pooled[arm]) > 2:
            out[f"{arm}_over_search_alone_p50"] = round(
                statistics.median(pooled[arm]) / statistics.median(pooled["alone"]), 2
            )
            out[f"{arm}_over_search_alone_ci95"] = ratio_ci(pooled["alone"], pooled[arm])
    rounds = sorted({p["round"] for p in phases if p["round"] is not None})
    out["per_round"] = []
    for r in rounds:
        cell = {p["arm"]: p for p in phases if p["round"] == r}
        x, y = cell["alone_turns"]["search"]["p50_ms"], cell["shared_turns"]["search"]["p50_ms"]
        out["per_round"].append(
            {
                "round": r,
                "alone_turns_p50_ms": x,
                "shared_turns_p50_ms": y,
                "ratio": round(y / x, 2) if x and y else None,
                "search_answered": {arm: cell[arm]["search"]["n"] for arm in cell},
                "shop_answered": {arm: cell[arm]["shop"]["answered"] for arm in cell},
            }
        )
    ratios = [row["ratio"] for row in out["per_round"] if row["ratio"] is not None]
    if len(ratios) >= 2:  # paired by round: each round ran both arms back to back, their order alternating
        from scipy import stats

        mean = statistics.fmean(ratios)
        half = float(stats.t.ppf(0.975, len(ratios) - 1)) * statistics.stdev(ratios) / len(ratios) ** 0.5
        out["per_round_ratio_mean"] = round(mean, 3)
        out["per_round_ratio_ci95_paired"] = [round(mean - half, 3), round(mean + half, 3)]
    out["answered_per_phase"] = {
        arm: round(statistics.fmean(p["search"]["n"] + p["shop"]["answered"] for p in phases if p["arm"] == arm), 1)
        for arm in ("alone_turns", "shared_turns")
        if any(p["arm"] == arm for p in phases)
    }
    out["all_requests"] = {
        project: dict(sum((Counter(p[project]["outcomes"]) for p in phases), Counter()))
        for project in ("search", "shop")
    }
    return out


def render(result: dict[str, Any]) -> str:
    from pipelines.reports import figure_html, new_figure, page, table_html

    phases = result["phases"]
    labels = [f"{p['arm']}" + (f" r{p['round']}" if p["round"] is not None else "") for p in phases]
    fig, (left, right) = new_figure(12, 4, ncols=2)
    data = [p["search"]["latencies_ms"] or [0.0] for p in phases]
    left.boxplot(data, showfliers=False)
    for i, values in enumerate(data, start=1):
        left.scatter([i] * len(values), values, s=8, alpha=0.5)
    left.set_xticks(range(1, len(labels) + 1), labels, rotation=30, ha="right")
    left.set_ylabel("search latency (ms), every answer")
    left.set_title("search through gw-a, per phase")
    codes = sorted({c for p in phases for c in p["shop"]["outcomes"]})
    bottom = [0] * len(phases)
    for code in codes:
        counts = [p["shop"]["outcomes"].get(code, 0) for p in phases]
        right.bar(labels, counts, bottom=bottom, label=code)
        bottom = [x + c for x, c in zip(bottom, counts)]
    right.set_title(f"shop (the flood, through {result['settings'].get('flood_through', 'gw-b')}) by outcome")
    right.tick_params(axis="x", rotation=30)
    if codes:
        right.legend()
    rows = [
        {
            "phase": label,
            "search answered": p["search"]["n"],
            "search outcomes": p["search"]["outcomes"],
            "search p50 ms (95 % CI)": f"{p['search']['p50_ms']} {p['search']['p50_ci95']}",
            "search p95 ms": p["search"]["p95_ms"],
            "shop outcomes": p["shop"]["outcomes"],
            **{
                f"{gw} turns": {k: v for k, v in p["turns"][gw].items() if k != "samples_raw"}
                for gw in ("gw-a", "gw-b")
            },
        }
        for label, p in zip(labels, phases)
    ]
    s = result["summary"]
    head = [
        {"setting": k, "value": v}
        for k, v in {
            "commit": result["commit"].get("sha"),
            "dirty": result["commit"].get("dirty"),
            **{k: v for k, v in result["settings"].items() if k != "work"},
        }.items()
    ]
    verdict = [{"figure": k, "value": v} for k, v in s.items() if k != "per_round"]
    return page(
        "Fair turns across two gateway replicas",
        [
            ("Run", table_html(head)),
            ("Summary (search's pooled latencies per arm)", table_html(verdict)),
            ("Per round", table_html(s["per_round"])),
            ("Phases", figure_html(fig, "search latency per phase and shop outcomes") + table_html(rows)),
        ],
        subtitle="bench/fair_replicas.py: every figure from the results JSON beside this page",
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/w/fair_replicas"))
    ap.add_argument("--seconds", type=float, default=50.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flood", type=int, default=6)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--instances",
        type=int,
        default=1,
        help="Triton instances of the shared base (backend_slots "
        "unset = this many: with 2 or more, the split of the slots between replicas is exercised)",
    )
    ap.add_argument(
        "--flood-through",
        default="gw-b",
        help="the replicas shop's clients go through, in turn "
        "(gw-b: the worst case for per-replica turns; gw-b,gw-a: both replicas have demand)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "fair_replicas.json")
    ap.add_argument(
        "--summarize",
        type=Path,
        default=None,
        help="a results file of this bench: its summary and page "
        "made again from its phases (nothing measured; the code doing it recorded as summary_commit)",
    )
    args = ap.parse_args()
    if args.summarize is not None:
        try:
            result = json.loads(args.summarize.read_text())
            result["summary"], result["summary_commit"] = summarize(result["phases"]), commit()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {args.summarize}: not a results file of this bench ({exc})", file=sys.stderr)
            return 2
        args.summarize.write_text(json.dumps(result, indent=1))
        args.summarize.with_suffix(".html").write_text(render(result), encoding="utf-8")
        print(json.dumps({k: v for k, v in result["summary"].items() if k != "per_round"}, indent=1))
        return 0
    flood_through = tuple(x.strip() for x in args.flood_through.split(",") if x.strip())
    if args.rounds < 1 or args.seconds <= 0 or args.flood < 1 or args.instances < 1:
        print("error: --rounds, --flood and --instances at least 1, --seconds above 0", file=sys.stderr)
        return 2
    if not flood_through or set(flood_through) - set(REPLICAS):
        print(f"error: --flood-through: one or more of {', '.join(REPLICAS)}", file=sys.stderr)
        return 2

    from pipelines.admission.fair import backend_slots
    from pipelines.services import free_port
    from pipelines.stack import triton as server

    code = commit()
    started = time.time()
    reqs = requests_for(args.seed)
    settings, keys, _status = set_up(args.work, args.new_tokens, args.seed, args.instances)
    ports = {r: free_port() for r in REPLICAS}
    urls = {r: f"http://127.0.0.1:{ports[r]}/v1" for r in REPLICAS}
    plan = [("alone", None)] + [
        (arm, r)
        for r in range(args.rounds)
        for arm in (("alone_turns", "shared_turns") if r % 2 == 0 else ("shared_turns", "alone_turns"))
    ]
    phases = []
    try:
        for i, (arm, r) in enumerate(plan):
            procs = start_gateways(
                settings, ports, 0.0 if arm == "alone_turns" else settings.gateway.turns_exchange_s, args.work
            )
            try:
                warmed = warm(urls, keys, reqs, ("search",) if arm == "alone" else ("search", "shop"), flood_through)
                result = phase(
                    urls,
                    keys,
                    reqs,
                    args.seconds,
                    0 if arm == "alone" else args.flood,
                    offset=i * 17,
                    flood_through=flood_through,
                )
            finally:
                stop_gateways(procs)
            result.update(arm=arm, round=r, warm_up=warmed)  # one request per project before the phase (200s)
            phases.append(result)
            s = result["search"]
            print(
                f"{arm:12s} round {r}: search {s['n']} answered, p50 {s['p50_ms']} ms {s['p50_ci95']}, outcomes "
                f"{s['outcomes']}; shop {result['shop']['outcomes']}; gw-b contended "
                f"{result['turns']['gw-b'].get('contended_share')}",
                flush=True,
            )
    finally:
        server.down(settings)
    summary = summarize(phases)
    result = {
        "bench": "fair_replicas",
        "commit": code,
        "seed": args.seed,
        "started": started,
        "seconds_total": round(time.time() - started, 1),
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "base_model": BASE_MODEL,
            "triton_instances": settings.triton.instances,
            "triton_threads": settings.triton.threads,
            "backend_slots": backend_slots(settings),
            "max_concurrent_requests": settings.gateway.max_concurrent_requests,
            "queue_timeout_s": settings.gateway.queue_timeout_s,
            "fair_window_s": settings.gateway.fair_window_s,
            "turns_exchange_s": settings.gateway.turns_exchange_s,
        },
        "summary": summary,
        "phases": phases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    args.out.with_suffix(".html").write_text(render(result), encoding="utf-8")
    print(json.dumps(dict(summary.items()), indent=1))
    print(f"wrote {args.out} and {args.out.with_suffix('.html')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
