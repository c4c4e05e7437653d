"""Projects renderers: the two-project benchmark (isolation, noisy neighbour, drift retrain; bench/projects.py)
and fair turns across gateway replicas (bench/fair_replicas.py)."""

from __future__ import annotations

from typing import Any

from docs.generate.md import Body, code, details, mapping, ms, num, pair, table
from docs.generate.result import Result

BOOTSTRAP = "bootstrap 95 % interval, independent samples"
PHASES = ("alone", "flood_fifo", "flood_no_quota", "flood_quota")


def with_interval(value: Any, ci: list[float] | None) -> str:
    """`value [low, high]`, or the value and the words saying no interval was recorded."""
    if value is None:
        return "n/a"
    return f"{num(value)} {pair(ci)}" if ci else f"{num(value)} ({pair(ci)})"


def projects(result: Result) -> Body:
    d = result.data
    s = d.get("settings", {})
    serving = " on one multi-LoRA base" if s.get("multi_lora") else ""
    teams = ", Airflow in multi-team mode" if s.get("multi_team") else ""
    what = (
        f"Two projects (shop, search){serving}{teams}: whether each key reaches only its own project's models and "
        f"runs, and search's latency while shop floods the gateway ({s.get('flood')} clients, "
        f"{num(s.get('seconds'))} s a phase; shop's quota {s.get('flood_rpm')} requests a minute)."
    )
    blocks = [noisy(d["noisy_neighbour"]), isolation(d.get("isolation", {}))]
    blocks += [b for b in (drift(d.get("drift")), steps(d.get("steps"))) if b]
    return Body(what, blocks)


def noisy(phases: dict[str, Any]) -> str:
    fifo = any("p50_ratio_to_fifo" in p["search"] for p in phases.values())
    turns = any(p.get("gateway_queue") for p in phases.values())
    headers = ["phase", "search n", "search p50 ms", "p50 95 % interval", "p50 / alone [interval]"]
    headers += ["p50 / first come first served [interval]"] if fifo else []
    headers += ["shop answered", "shop refused 429"] + (["model contended (share of samples)"] if turns else [])
    rows = []
    for name in [p for p in PHASES if p in phases] + [p for p in phases if p not in PHASES]:
        srch, shop = phases[name]["search"], phases[name]["shop"]
        row = [name, srch.get("n"), ms(srch.get("p50_ms")), pair(srch.get("p50_ci95"), ms)]
        row.append(with_interval(srch.get("p50_ratio_to_alone"), srch.get("p50_ratio_ci95")))
        if fifo:
            row.append(with_interval(srch.get("p50_ratio_to_fifo"), srch.get("p50_ratio_to_fifo_ci95")))
        row += [shop.get("answered"), shop.get("outcomes", {}).get("429", 0)]
        if turns:
            row.append(share(phases[name].get("gateway_queue")))
        rows.append(row)
    lead = f"Noisy neighbour: search's answered requests per phase (intervals: {BOOTSTRAP}, as recorded)."
    return lead + "\n\n" + table(headers, rows)


def share(queue: dict[str, Any] | None) -> str:
    if not queue:
        return "n/a"
    return f"{num(queue.get('contended_share', 0) * 100)} % of {queue.get('samples')}"


def isolation(iso: dict[str, Any]) -> str:
    rows = [(code(k), flat(v)) for k, v in iso.items() if k != "models"]
    return "Isolation checks, as recorded:\n\n" + table(["check", "result"], rows)


def flat(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k}: {flat(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(flat(v) for v in value) or "none"
    return num(value) if not isinstance(value, str) else value


def drift(dr: dict[str, Any] | None) -> str | None:
    if not dr:
        return None
    retrain = dr.get("shop_retrain") or {}
    rows = [
        ("drift check", dr.get("check")),
        ("alerts", flat(dr.get("alerts") or {}) or "none"),
        ("shop's asset-triggered retrain", f"{retrain.get('state')} ({retrain.get('run_type')})"),
        ("asset-triggered runs", flat(dr.get("asset_triggered_runs", {}))),
        ("daily runs failed", len(dr.get("daily_runs_failed") or [])),
        ("seconds", dr.get("seconds")),
    ]
    return "Drift and the retrain it triggers:\n\n" + table(["", "result"], rows)


def steps(st: dict[str, Any] | None) -> str | None:
    return details("step timings (s)", mapping(st, ("step", "seconds"))) if st else None


def fair_replicas(result: Result) -> Body:
    d = result.data
    s, summary = d.get("settings", {}), d["summary"]
    what = (
        f"Fair turns across two gateway replicas ({s.get('triton_instances')} Triton instance(s), flood through "
        f"{s.get('flood_through', 'gw-b')}): search's latency through one replica while shop's {s.get('flood')} "
        f"clients flood, each replica keeping its own turns (`alone_turns`) against the replicas exchanging them "
        f"(`shared_turns`), {s.get('rounds')} rounds of {num(s.get('seconds'))} s, order alternating."
    )
    n, p50 = summary["search_n"], summary["search_p50_ms"]
    pooled = table(["arm", "search n", "search p50 ms"], [(arm, n[arm], ms(p50[arm])) for arm in n])
    ratios = [
        ("shared_turns / alone_turns", "shared_over_alone_turns"),
        ("alone_turns / search alone", "alone_turns_over_search_alone"),
        ("shared_turns / search alone", "shared_turns_over_search_alone"),
    ]
    rows = [(name, num(summary.get(f"{k}_p50")), pair(summary.get(f"{k}_ci95")), BOOTSTRAP) for name, k in ratios]
    per_round = summary.get("per_round", [])
    rows.append(
        (
            "shared_turns / alone_turns, per round (mean)",
            num(summary.get("per_round_ratio_mean")),
            pair(summary.get("per_round_ratio_ci95_paired")),
            f"paired by round, t-interval, n = {len(per_round)} rounds",
        )
    )
    compare = table(["search p50 ratio", "value", "95 % interval", "interval"], rows)
    rounds = table(
        ["round", "search n alone_turns / shared_turns", "alone_turns p50 ms", "shared_turns p50 ms", "ratio"],
        [
            (
                r["round"],
                f"{r['search_answered'].get('alone_turns')} / {r['search_answered'].get('shared_turns')}",
                ms(r["alone_turns_p50_ms"]),
                ms(r["shared_turns_p50_ms"]),
                num(r["ratio"]),
            )
            for r in per_round
        ],
    )
    answered = summary.get("answered_per_phase", {})
    tail = f"Requests answered a phase (both projects, mean): {flat(answered)}; every request by outcome: "
    tail += flat(summary.get("all_requests", {})) + "."
    return Body(what, ["Pooled over rounds:\n\n" + pooled, compare, rounds, tail])
