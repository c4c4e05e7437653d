"""Curves as PNG files (matplotlib, Agg): each figure carries its file, commit, date, machine and n, and its
interval as error bars where the file records one (the kind of interval named under the plot)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 (the backend is chosen first)

from docs.generate.result import Result  # noqa: E402


@dataclass(frozen=True)
class Series:
    label: str
    x: Sequence[float]
    y: Sequence[float | None]
    low: Sequence[float | None] | None = None
    high: Sequence[float | None] | None = None


@dataclass(frozen=True)
class Axes:
    xlabel: str
    ylabel: str
    log: int | None = None  # the x axis's log base, or linear
    reference: float | None = None  # a horizontal line (e.g. 1.0 for a ratio)


def line(result: Result, name: str, title: str, series: Sequence[Series], axes: Axes, n: str, bars: str = "") -> str:
    """Draw the series, write img/<stem>-<name>.png and return the Markdown image line."""
    fig, ax = plt.subplots(figsize=(7.0, 3.9), dpi=110)
    for i, s in enumerate(series):
        _draw(ax, _dodged(s, i, len(series)) if axes.log and s.low is not None else s)
    if axes.reference is not None:
        ax.axhline(axes.reference, color="0.6", linewidth=0.8, linestyle="--")
    if axes.log:
        ax.set_xscale("log", base=axes.log)
        ax.minorticks_off()
    xs = sorted({x for s in series for x in s.x})
    ax.set_xticks(xs, [f"{x:,.0f}" if x >= 1000 else f"{x:g}" for x in xs])
    ax.set(xlabel=axes.xlabel, ylabel=axes.ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    foot = f"{result.name} · {result.prov.footer()}\n{n}" + (f" · bars: {bars}" if bars else "")
    fig.text(0.01, 0.01, foot, fontsize=7, color="0.35", va="bottom")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    result.img_dir.mkdir(parents=True, exist_ok=True)
    target = result.img_dir / f"{result.stem}-{name}.png"
    fig.savefig(target, metadata={"Software": None})
    plt.close(fig)
    return f"![{title}]({result.img_dir.name}/{target.name})"


def _dodged(s: Series, i: int, count: int) -> Series:
    """Interval bars side by side, not on top of each other: each series a little off its x (log axis)."""
    factor = 1 + 0.03 * (i - (count - 1) / 2)
    return Series(s.label, [x * factor for x in s.x], s.y, s.low, s.high)


def _draw(ax: plt.Axes, s: Series) -> None:
    points = [(x, y, i) for i, (x, y) in enumerate(zip(s.x, s.y)) if y is not None]
    if not points:
        return
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if s.low is None or s.high is None:
        ax.plot(xs, ys, marker="o", label=s.label)
        return
    lows = [s.low[i] for *_, i in points]
    highs = [s.high[i] for *_, i in points]
    err = [
        [y - lo if lo is not None else 0 for y, lo in zip(ys, lows)],
        [hi - y if hi is not None else 0 for y, hi in zip(ys, highs)],
    ]
    ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=s.label)
