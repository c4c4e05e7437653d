"""HTML for a drift check: the verdict, a table of every signal, before/after plots per signal."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipelines.drift.signals import CATEGORICAL, NUMERIC, Summary
from pipelines.reports import figure_html, new_figure, page, table_html


def _categorical_figure(name: str, ref: dict[str, int], cur: dict[str, int]) -> str:
    keys = sorted(set(ref) | set(cur), key=lambda k: -(ref.get(k, 0) + cur.get(k, 0)))[:15]
    r = np.array([ref.get(k, 0) for k in keys], dtype=float)
    c = np.array([cur.get(k, 0) for k in keys], dtype=float)
    fig, ax = new_figure(7, 2.8)
    x = np.arange(len(keys))
    ax.bar(x - 0.2, r / max(1.0, sum(ref.values())), width=0.4, label="reference (champion's training window)")
    ax.bar(x + 0.2, c / max(1.0, sum(cur.values())), width=0.4, label="current window")
    ax.set_xticks(x, keys, rotation=35, ha="right", fontsize=7)
    ax.set(ylabel="share", title=name)
    ax.legend(fontsize=7)
    return figure_html(fig, f"{name}: reference vs current")


def _numeric_figure(name: str, ref: list[float], cur: list[float]) -> str:
    fig, ax = new_figure(7, 2.6)
    both = np.array(ref + cur)
    if both.size:
        bins = np.linspace(np.nanpercentile(both, 1), np.nanpercentile(both, 99), 30)
        ax.hist(ref, bins=bins, density=True, alpha=0.5, label="reference")
        ax.hist(cur, bins=bins, density=True, alpha=0.5, label="current")
        ax.legend(fontsize=7)
    ax.set(title=name)
    return figure_html(fig, f"{name}: reference vs current")


def render_html(result: dict[str, Any], ref: Summary, cur: Summary) -> str:
    rows = [
        {
            "signal": s["signal"],
            "kind": s["kind"],
            "metric": s["metric"],
            "value": s["value"],
            "band": s["band"],
            **dict(s["detail"].items()),
        }
        for s in result["signals"]
    ]
    columns = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    table = table_html([{c: r.get(c) for c in columns} for r in rows])
    plots = "".join(_categorical_figure(c, ref.categorical[c], cur.categorical[c]) for c in CATEGORICAL)
    plots += "".join(_numeric_figure(c, ref.numeric_sample[c], cur.numeric_sample[c]) for c in NUMERIC)
    verdict = (
        f"<p><b>verdict: {result['verdict']}</b>; alert emitted: {result['fire']}"
        f"{' (suppressed by the cooldown)' if result.get('suppressed_by_cooldown') else ''}. "
        f"{result.get('reason', '')}</p>"
    )
    return page(
        "Drift check",
        [("Verdict", verdict), ("Signals", table), ("Before / after", plots)],
        subtitle=f"window {result['window']['start']}..{result['window']['end']} "
        f"({result.get('records', 0)} clean records) vs the champion's training window "
        f"{result['reference_window']['start']}..{result['reference_window']['end']}",
    )
