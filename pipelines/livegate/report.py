"""`flywheel gateway report` and `gate`: live agreement between candidates and the teacher, from the
comparisons the gateway recorded (`comparisons.read_comparisons`), as JSON + HTML (plots), on the
candidate's MLflow run; and the live gate's moves that need more than the gateway itself does
(a passing canary becomes `serve`, its candidate deployed as the live model)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from pipelines.config import Settings
from pipelines.livegate import routes as rt
from pipelines.livegate.comparisons import read_comparisons, tally_of
from pipelines.storage import write_json, write_text


def _p50(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 1) if present else None


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (route, mode, arm): requests, comparisons, skips, errors, agreement with its running
    always-valid interval, latencies."""
    from pipelines.stats import always_valid

    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["route"], r["mode"], r["arm"])].append(r)
    rows = []
    for (route, mode, arm), group in sorted(groups.items()):
        compared = [r["agreement"] for r in group if r["agreement"] is not None]
        f1 = [a["arg_f1"] for a in compared if a["arg_f1"] is not None]
        rows.append(
            {
                "route": route,
                "mode": mode,
                "arm": arm,
                "requests": len(group),
                "compared": len(compared),
                "skipped": sum(1 for r in group if r["skipped"]),
                "errors": sum(1 for r in group if r["error"] is not None and not r["skipped"]),
                "agreement_name": round(sum(a["name"] for a in compared) / len(compared), 4) if compared else None,
                "agreement_exact": round(sum(a["exact"] for a in compared) / len(compared), 4) if compared else None,
                "agreement_arg_f1": round(sum(f1) / len(f1), 4) if f1 else None,
                # the running always-valid 95 % intervals the live gate decides on (evaluate.paired)
                **{
                    f"agreement_{m}_interval": [
                        round(v, 3) for v in always_valid(sum(a[m] for a in compared), len(compared))
                    ]
                    for m in ("name", "exact")
                },
                "agreement_arg_f1_interval": [round(v, 3) for v in always_valid(sum(f1), len(f1), binary=False)],
                "candidate_p50_ms": _p50([r["candidate_latency_ms"] for r in group]),
                "reference_p50_ms": _p50([r["reference_latency_ms"] for r in group]),
            }
        )
    return rows


def build_report(settings: Settings, since: str | None = None) -> dict[str, Any]:
    from pipelines.reports import figure_html, new_figure, page, table_html

    records = read_comparisons(settings, since)
    routes = rt.read_routes(settings)
    rows = summarize(records)
    generated = datetime.now(UTC).isoformat(timespec="seconds")
    report = {
        "generated_at": generated,
        "since": since,
        "comparisons": len(records),
        "summary": rows,
        "routes": routes["routes"],
        "history": routes.get("history", [])[-50:],
        "gate": {
            "metric": settings.gateway.agreement_metric,
            "min_agreement": settings.gateway.min_agreement,
            "requests": settings.gateway.gate_requests,
        },
    }
    fig, (left, right) = new_figure(11, 3.6, ncols=2)
    compared = [r for r in rows if r["compared"]]
    labels = [f"{r['route']}/{r['mode']}" for r in compared]
    for i, metric in enumerate(("agreement_name", "agreement_exact", "agreement_arg_f1")):
        left.bar(
            [x + i * 0.27 for x in range(len(compared))],
            [r[metric] or 0 for r in compared],
            width=0.27,
            label=metric.removeprefix("agreement_"),
        )
    left.axhline(settings.gateway.min_agreement, color="grey", linestyle="--", linewidth=1)
    left.set_xticks(range(len(compared)), labels, fontsize=7)
    left.set(ylim=(0, 1), title="agreement with the teacher")
    left.legend(fontsize=7)
    for i, key in enumerate(("candidate_p50_ms", "reference_p50_ms")):
        right.bar(
            [x + i * 0.4 for x in range(len(compared))],
            [r[key] or 0 for r in compared],
            width=0.4,
            label=key.removesuffix("_p50_ms"),
        )
    right.set_xticks(range(len(compared)), labels, fontsize=7)
    right.set(title="p50 latency (ms)")
    right.legend(fontsize=7)
    html = page(
        "Live agreement (gateway shadow and canary traffic)",
        [
            ("Summary", table_html(rows) if rows else "<p>No shadow or canary traffic recorded yet.</p>"),
            ("Agreement and latency", figure_html(fig, "agreement and latency per route")),
            (
                "Routes",
                table_html([{"route": k, **v} for k, v in routes["routes"].items()]) or "<p>every route serves</p>",
            ),
            ("Route changes", table_html(report["history"]) if report["history"] else "<p>none</p>"),
        ],
        subtitle=f"{len(records)} comparisons{' since ' + since if since else ''}; generated {generated}",
    )
    folder = f"{settings.zone('reports')}/gateway/{generated.replace(':', '').replace('-', '')}"
    report["json_uri"], report["html_uri"] = f"{folder}/report.json", f"{folder}/report.html"
    write_json(report["json_uri"], report)
    write_text(report["html_uri"], html)
    write_json(f"{settings.zone('reports')}/gateway/latest.json", report)
    report["mlflow"] = _log_to_mlflow(settings, report)
    return report


def _log_to_mlflow(settings: Settings, report: dict[str, Any]) -> str | None:
    """The report on the candidate version's run, its agreement as a version tag; None without a candidate."""
    import tempfile
    from pathlib import Path

    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import alias_version

    version = alias_version(settings, "candidate")
    if version is None:
        return None
    client = mlflow_client(settings)
    name = settings.mlflow.registered_model
    run_id = client.get_model_version(name, version).run_id
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "report.json").write_text(json.dumps(report, indent=2, default=str))
        client.log_artifacts(run_id, tmp, "live_agreement")
    headline = [
        {k: r[k] for k in ("route", "mode", "compared", "agreement_name", "agreement_exact")}
        for r in report["summary"]
        if r["arm"] == "candidate"
    ]
    client.set_model_version_tag(name, version, "flywheel.live_agreement", json.dumps(headline)[:4900])
    return f"{name} v{version}"


def gate(settings: Settings, model: str = "champion") -> dict[str, Any]:
    """Apply the live gate to route `model` now: shadow -> canary, a failing canary -> serve, and a passing
    canary -> serve with its candidate deployed as the live model (smoke-tested; on failure the live
    model keeps serving and the route stays in canary)."""
    from pipelines.registry.models import alias_version
    from pipelines.serve import deploy

    route = rt.route_of(rt.read_routes(settings), model)
    if route["mode"] == "serve":
        return {"route": model, "mode": "serve", "moved": False, "reason": "the route serves; nothing to gate"}
    tally = tally_of(settings, model, route)
    move = rt.decide(settings, route, tally)
    if move is not None:
        after = rt.set_route(
            settings,
            model,
            move[0],
            candidate=route["candidate"],
            share=route.get("share"),
            reason=move[1],
            expect=route["mode"],
        )
        return {"route": model, "mode": after["mode"], "moved": True, "reason": move[1], "tally": tally.to_dict()}
    ready, reason = rt.canary_ready(settings, route, tally)
    if not ready:
        return {"route": model, "mode": route["mode"], "moved": False, "reason": reason, "tally": tally.to_dict()}
    version = (
        alias_version(settings, route["candidate"])
        if not route["candidate"].startswith("v")
        else route["candidate"][1:]
    )
    if version is None:
        return {
            "route": model,
            "mode": route["mode"],
            "moved": False,
            "reason": f"no registry version has the alias {route['candidate']}",
        }
    deployed = deploy.deploy(settings, version=version)
    rt.set_route(settings, model, "serve", reason=f"{reason}; v{version} deployed as the live model", expect="canary")
    return {
        "route": model,
        "mode": "serve",
        "moved": True,
        "reason": reason,
        "deployed": deployed.get("deployed"),
        "tally": tally.to_dict(),
    }


def start_canary(
    settings: Settings, alias: str = "candidate", share: float | None = None, requests: int = 8, route: str = "champion"
) -> dict[str, Any]:
    """`flywheel deploy --canary`: the candidate is loaded next to the live model and answers `requests`
    replayed test rows first (no live caller sees a model that cannot answer), then the gateway's route
    sends it `share` of live traffic; the live gate watches it from there."""
    from pipelines.serve import canary, deploy

    share = settings.gateway.canary_share if share is None else share
    replayed = canary.canary(settings, alias, share=0.5, requests=requests)
    candidate = replayed["models"][replayed["candidate"]]
    if candidate["errors"]:
        raise deploy.DeployFailed(
            f"canary: {replayed['candidate']} failed {candidate['errors']} of {candidate['requests']} "
            f"replayed requests; live traffic stays with {replayed['live']}"
        )
    changed = rt.set_route(
        settings,
        route,
        "canary",
        share=share,
        candidate=alias,
        reason=f"flywheel deploy --canary {share} ({replayed['candidate']} answered "
        f"{candidate['requests']} replayed requests)",
    )
    return {**replayed, "route": {"name": route, **changed}}
