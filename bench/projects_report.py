"""The two-project benchmark's HTML page (`bench/projects.py`): what its JSON holds, for a person to read.

Isolation (each key's answers and refusals, the viewer's MLflow reads), Triton's loaded models, the noisy
neighbour (search's latency per phase with every request, shop's outcomes), and the drift retrain. Every
figure comes from the results JSON it is rendered from (`render(result)`); nothing is measured here.

Usage: .venv/bin/python bench/projects_report.py bench/results/projects.json  (writes projects.html beside it)
"""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path
from typing import Any

PHASES = ("alone", "flood_fifo", "flood_no_quota", "flood_quota")


def _isolation_rows(iso: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for p, other in (("shop", "search"), ("search", "shop")):
        rows.append(
            {
                "key of": p,
                "models it lists": ", ".join(f"{a} -> {m}" for a, m in iso.get("models", {}).get(p, {}).items()),
                "answered by": ", ".join(f"{a}: {m}" for a, m in iso.get(f"{p}_answered_by", {}).items()),
                "its own models only": iso.get(f"{p}_own_models_only"),
                "asking the other project's models": ", ".join(
                    f"{m}: {o}" for m, o in iso.get(f"{p}_asking_{other}_models", {}).items()
                ),
            }
        )
    return rows


def _noisy_rows(phases: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name in PHASES:
        if name not in phases:
            continue
        s, shop = phases[name]["search"], phases[name]["shop"]
        rows.append(
            {
                "phase": name,
                "search n (200s)": s.get("n"),
                "search outcomes": s.get("outcomes", {}),
                "search p50 ms": s.get("p50_ms"),
                "p50 95% CI": s.get("p50_ci95"),
                "search p95 ms": s.get("p95_ms"),
                "p50 / alone": s.get("p50_ratio_to_alone"),
                "ratio 95% CI": s.get("p50_ratio_ci95"),
                "p50 / first come first served": s.get("p50_ratio_to_fifo"),
                "first come first served ratio 95% CI": s.get("p50_ratio_to_fifo_ci95"),
                "shop clients": shop.get("clients"),
                "shop outcomes": shop.get("outcomes", {}),
                "gateway turns (sampled every 2 s)": phases[name].get("gateway_queue"),
            }
        )
    return rows


def _noisy_figure(phases: dict[str, Any]) -> str:
    from pipelines.reports import figure_html, new_figure

    names = [n for n in PHASES if n in phases]
    fig, (left, right) = new_figure(11, 3.8, ncols=2)
    data = [phases[n]["search"].get("latencies_ms") or [0.0] for n in names]
    left.boxplot(data, showfliers=False)
    for i, values in enumerate(data, start=1):  # every answered request, not only the box
        left.scatter([i] * len(values), values, s=8, alpha=0.5)
    left.set_xticks(range(1, len(names) + 1), names)
    left.set_ylabel("search latency (ms), every answered request")
    left.set_title("search (one client) per phase")
    codes = sorted({c for n in names for c in phases[n]["shop"].get("outcomes", {})})
    bottom = [0] * len(names)
    for code in codes:
        counts = [phases[n]["shop"].get("outcomes", {}).get(code, 0) for n in names]
        right.bar(names, counts, bottom=bottom, label=code)
        bottom = [b + c for b, c in zip(bottom, counts)]
    right.set_ylabel("shop requests")
    right.set_title("shop (the flood) by outcome")
    if codes:
        right.legend()
    return figure_html(fig, "search latency per phase and shop outcomes per phase")


def render(result: dict[str, Any]) -> str:
    from pipelines.reports import page, table_html

    settings = result.get("settings", {})
    sections = [
        (
            "Run",
            table_html(
                [
                    {
                        "commit": result.get("commit", {}).get("sha"),
                        "dirty": result.get("commit", {}).get("dirty"),
                        "day": result.get("day"),
                        "seed": result.get("seed"),
                        "multi_lora": settings.get("multi_lora"),
                        "multi_team": settings.get("multi_team"),
                        "seconds a phase": settings.get("seconds"),
                        "flood clients": settings.get("flood"),
                        "flood rpm quota": settings.get("flood_rpm"),
                    }
                ]
            ),
        ),
        ("Steps (seconds)", table_html([{"step": k, "seconds": v} for k, v in result.get("steps", {}).items()])),
    ]
    if "isolation" in result:
        iso = result["isolation"]
        sections.append(("Isolation: each project's key", table_html(_isolation_rows(iso))))
        sections.append(
            (
                "Isolation: carol (viewer of shop) through MLflow's REST API",
                table_html([{"project": p, **(iso.get(f"carol_reads_{p}_runs") or {})} for p in ("shop", "search")]),
            )
        )
        if "airflow" in iso:  # --multi-team: carol's Airflow login for shop
            a = iso["airflow"]
            sections.append(
                (
                    "Isolation: carol@shop (viewer) through Airflow's REST API",
                    table_html(
                        [
                            {
                                "lists": ", ".join(a.get("carol_lists", [])),
                                "reads search's DAG": a.get("carol_reads_search_dag"),
                                "triggers shop's DAG": a.get("carol_triggers_shop_dag"),
                            }
                        ]
                    ),
                )
            )
    if "triton" in result:
        t = result["triton"]
        sections.append(
            (
                "Triton: loaded models (each a base copy in memory) and what it serves",
                table_html(
                    [
                        {
                            "loaded models": ", ".join(t.get("loaded_models", [])),
                            "served": ", ".join(t.get("served", [])),
                            "error": t.get("error"),
                        }
                    ]
                ),
            )
        )
    if "noisy_neighbour" in result:
        phases = result["noisy_neighbour"]
        sections.append(("Noisy neighbour", _noisy_figure(phases) + table_html(_noisy_rows(phases))))
    if "drift" in result:
        d = result["drift"]
        sections.append(
            (
                "Drift in shop retrains shop only",
                table_html(
                    [
                        {
                            "check": d.get("check"),
                            "error": d.get("error"),
                            "shop retrain": d.get("shop_retrain"),
                            "asset-triggered runs": d.get("asset_triggered_runs"),
                            "seconds": d.get("seconds"),
                            "daily runs failed by the bench": len(d.get("daily_runs_failed") or []),
                        }
                    ]
                )
                + (f"<p>{html.escape(d['note_by_hand'])}</p>" if d.get("note_by_hand") else ""),
            )
        )
    return page(
        "Two AI projects on one platform",
        sections,
        subtitle=(
            "bench/projects.py: isolation, noisy neighbour and drift; "
            "every figure from the results JSON beside this page"
        ),
    )


def write(result: dict[str, Any], json_path: Path) -> Path:
    out = json_path.with_suffix(".html")
    out.write_text(render(result), encoding="utf-8")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("error: give one results JSON of bench/projects.py (e.g. bench/results/projects.json)", file=sys.stderr)
        return 2
    path = Path(argv[0])
    print(f"wrote {write(json.loads(path.read_text()), path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
