"""HTML for the serving benchmark: the comparison table, latency and throughput against concurrency."""

from __future__ import annotations

import html
from typing import Any

from pipelines.reports import figure_html, new_figure, page, table_html

LATENCY_KEYS: tuple[str, ...] = ("concurrency", "requests", "errors", "ttft_ms", "itl_ms", "p50_ms", "p95_ms")
LATENCY_KEYS += ("p99_ms", "requests_per_s")
QUALITY_KEYS = ("prompt_tokens_mean", "exact_match", "usd_per_million_requests")
COLUMNS = ("model", *LATENCY_KEYS, "output_tokens_per_s", *QUALITY_KEYS)  # a run's fields on the HTML page


def _pct(comparison: dict[str, Any], key: str) -> str:
    return "n/a" if comparison.get(key) is None else f"{comparison[key]:+.1%}"


def change_line(comparison: dict[str, Any]) -> str:
    """The median latency's change with its paired interval and n: how the CLI, the demo and the page say it."""
    text, ci = _pct(comparison, "latency_p50_change"), comparison.get("latency_p50_change_ci95")
    if ci and text != "n/a":
        text += f" (paired 95 % CI {ci[0]:+.1%} to {ci[1]:+.1%}, n = {comparison.get('paired_requests')})"
    return text


def _latencies(run: dict[str, Any]) -> str:
    """A run's request latencies in order, an errored one marked *."""
    errored = set(run.get("errored") or [])
    return ", ".join(f"{ms:,.0f}{'*' if i in errored else ''}" for i, ms in enumerate(run.get("latencies_ms") or []))


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= factor:
            return f"{value / factor:,.1f} {prefix}{unit}"
    return f"{value:,.0f} {unit}"


def concurrency_figure(
    runs: list[dict[str, Any]], solid: tuple[str, str], dashed: tuple[str, str], latency_title: str
) -> Any:
    """Latency (two series per model: `solid` and `dashed`, each (key, label)) and throughput against
    concurrency, one line per model: the serving benchmark's and AIPerf's figure."""
    fig, (left, right) = new_figure(11, 3.6, ncols=2)
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        levels = [r["concurrency"] for r in mine]
        left.plot(levels, [r[solid[0]] for r in mine], marker="o", label=f"{model} {solid[1]}")
        left.plot(levels, [r[dashed[0]] for r in mine], marker="x", linestyle="--", label=f"{model} {dashed[1]}")
        right.plot(levels, [r["requests_per_s"] for r in mine], marker="o", label=model)
    left.set(xlabel="concurrent requests", ylabel="latency (ms)", title=latency_title)
    right.set(xlabel="concurrent requests", ylabel="requests/s", title="throughput")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    return fig


def precision_lines(report: dict[str, Any]) -> list[str]:
    """One line per precision and concurrency against fp32 (the CLI's and the page's summary)."""
    found = report.get("precision") or {}

    def ratio(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.2f}x"

    lines = []
    for r in found.get("rows", []):
        em = r["exact_match_diff"]
        paired = "n/a" if em["diff"] is None else f"{em['diff']:+.3f} [{em['low']:+.3f}, {em['high']:+.3f}]"
        lines.append(
            f"{r['precision']} vs {found['reference']} at concurrency {r['concurrency']}: output tokens/s "
            f"{ratio(r['output_tokens_per_s_ratio'])}, TTFT {ratio(r['ttft_ratio'])}, ITL {ratio(r['itl_ratio'])}, "
            f"exact match {paired} (paired 95 %, n = {em['n']}; "
            f"{'held' if r['quality_held'] else 'not shown held'} at margin {found['margin']}), wrong writes "
            + " vs ".join(f"{k} {v}" for k, v in r["wrong_writes"].items())
        )
    return lines


def _precision_sections(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The precision comparison (`bench.precisions`), when the report has one."""
    found = report.get("precision") or {}
    if not found.get("rows"):
        return []
    text = "".join(f"<li>{html.escape(line)}</li>" for line in precision_lines(report))
    return [
        (
            f"Precision against {found['reference']}",
            f"<p>Served precision: {html.escape(str(report.get('served_precision')))}. Ratios are one timed pass "
            f"per precision (no interval); exact match is paired per request.</p><ul>{text}</ul>",
        )
    ]


def render_html(report: dict[str, Any]) -> str:
    runs = report["runs"]
    rows = [{c: r.get(c) for c in COLUMNS} for r in runs]
    if report.get("direct"):
        rows.append({c: report["direct"].get(c) for c in COLUMNS})
    for row in rows:  # percentiles the sample does not support (pipelines.bench.results.percentile)
        row.update({c: "n/a" for c in ("ttft_ms", "itl_ms", "p50_ms", "p95_ms", "p99_ms") if row[c] is None})
    fig = concurrency_figure(runs, ("p50_ms", "p50"), ("p95_ms", "p95"), "latency")
    hw = report["hardware"]
    comparison = report.get("comparison") or {}
    pct = lambda key: _pct(comparison, key)  # noqa: E731
    level = comparison.get("concurrency") or next((r["concurrency"] for r in runs if r["model"].startswith("tuned")), 1)
    summary = table_html(
        [
            {"metric": f"median latency (p50), concurrency {level}", "change": change_line(comparison)},
            {"metric": "prompt tokens (mean)", "change": pct("prompt_tokens_change")},
            {"metric": f"throughput (answered requests/s), concurrency {level}", "change": pct("throughput_change")},
            {"metric": "cost per million requests", "change": pct("cost_change")},
        ]
        + [
            {"metric": f"exact match, {k}", "change": f"{v:.3f}"}
            for k, v in (comparison.get("exact_match") or {}).items()
        ]
        + [{"metric": "Triton overhead at concurrency 1 (p50, ms)", "change": report.get("triton_overhead_ms")}]
    )
    if comparison.get("interval"):
        summary += (
            f"<p>Interval: {html.escape(comparison['interval'])}. Throughput and cost come from one timed "
            "pass per model (no interval).</p>"
        )
    every = table_html(
        [
            {
                "model": r["model"],
                "concurrency": r["concurrency"],
                "latency of each request, ms (in order; * errored, counted at the client's timeout)": _latencies(r),
            }
            for r in runs
            if r.get("latencies_ms") is not None
        ]
    )
    notes = (
        "<p>Every request is streamed from the decoupled model: TTFT is the median time to its first "
        "text, ITL the median of each request's mean time per output token after the first. The in-process "
        "row is not streamed.</p>"
    )
    return page(
        f"Serving benchmark: {report['live']}" + (f" vs {report['baseline']}" if report.get("baseline") else ""),
        [
            ("Base + few-shot vs tuned", summary),
            *_precision_sections(report),
            ("Runs", table_html(rows) + notes),
            ("Latency and throughput", figure_html(fig, "latency and throughput against concurrency")),
            ("Every request", every),
            (
                "Hardware",
                table_html(
                    [
                        {
                            "device": hw["name"],
                            "peak bf16": _si(hw["peak_bf16_flops"], "FLOP/s"),
                            "memory bandwidth": _si(hw["memory_bandwidth"], "B/s"),
                            "$ / hour": hw["usd_per_hour"],
                            "price source": hw.get("price_source", "not stated"),
                            "price as of": hw.get("price_date", ""),
                        }
                    ]
                )
                + "<p>Cost per million requests = $/hour / requests per hour on this one device: between two models "
                "on it, the cost change is the throughput change restated.</p>",
            ),
        ],
        subtitle=f"{report['requests']} test-split requests over {report['protocol']}; "
        f"generated {report['generated_at']}",
    )
