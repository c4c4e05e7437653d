"""The evaluation report as HTML: the conditions side by side, per-tool breakdown, confusion matrices."""

from __future__ import annotations

from typing import Any

from pipelines.evaluate.results import ConditionResult, EvalReport
from pipelines.reports import figure_html, new_figure, page, table_html

QUALITY = ("exact_match", "text_f1", "name_accuracy", "arg_f1", "json_valid")


def _quality_plot(report: EvalReport) -> str:
    fig, ax = new_figure()
    width = 0.8 / max(1, len(report.conditions))
    for i, c in enumerate(report.conditions):
        values = [c.summary.get(m) or 0.0 for m in QUALITY]
        ax.bar([x + i * width for x in range(len(QUALITY))], values, width, label=c.condition)
    ax.set_xticks([x + width * (len(report.conditions) - 1) / 2 for x in range(len(QUALITY))], QUALITY)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("quality on the same requests")
    return figure_html(fig, "quality per condition")


def _cost_plot(report: EvalReport) -> str:
    fig, (left, right) = new_figure(10, 3, ncols=2)
    names = [c.condition for c in report.conditions]
    left.barh(names, [c.stats["prompt_tokens_mean"] for c in report.conditions])
    left.set_title("prompt tokens per request")
    right.barh(names, [c.stats["latency_ms_p50"] for c in report.conditions])
    right.set_title("latency p50, batch 1 (ms)")
    right.tick_params(labelleft=False)  # the same conditions, in the same order: named once, on the left
    fig.tight_layout()
    return figure_html(fig, "prompt tokens and latency")


def _confusion_plot(c: ConditionResult) -> str:
    labels = sorted({*c.confusion, *(p for row in c.confusion.values() for p in row)})
    matrix = [[c.confusion.get(t, {}).get(p, 0) for p in labels] for t in labels]
    fig, ax = new_figure(7, 6)
    ax.imshow(matrix, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("expected")
    for i, row in enumerate(matrix):
        for j, v in enumerate(row):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=6)
    ax.set_title(f"confusion: {c.condition}")
    return figure_html(fig, f"confusion matrix {c.condition}")


def _per_tool_rows(c: ConditionResult) -> list[dict[str, Any]]:
    return [
        {
            "tool": tool,
            "examples": s["examples"],
            "name_accuracy": s["name_accuracy"],
            "exact_match": s["exact_match"],
            "text_f1": s.get("text_f1"),
            "arg_f1": s["arg_f1"],
            "wrong_writes": s.get("wrong_writes"),
        }
        for tool, s in c.per_tool.items()
    ]


def _wrong_writes(c: ConditionResult) -> str:
    """Every wrong write of a condition, request by request (the worst error a tool caller makes)."""
    summary = c.summary
    head = (
        f"<p><b>wrong writes: {summary.get('wrong_writes', 0)} of {summary.get('examples', 0)}</b> "
        f"({', '.join(f'{k} {v}' for k, v in (summary.get('wrong_write_kinds') or {}).items())})</p>"
    )
    return head + (table_html(c.wrong_writes) if c.wrong_writes else "")


PAIRED = ("task", "exact_match", "name_accuracy", "arg_f1", "text_f1")


def comparison_rows(comparisons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (condition, reference, metric): the paired difference, its 95 % interval, n, and for
    yes/no metrics McNemar's wins/losses/p."""
    rows = []
    for c in comparisons:
        for metric in PAIRED:
            e = c["metrics"].get(metric) or {}
            if not e.get("n"):
                continue
            m = e.get("mcnemar") or {}
            rows.append(
                {
                    "condition": c["condition"],
                    "vs": c["reference"],
                    "metric": metric,
                    "n": e["n"],
                    "difference": e["diff"],
                    "ci_low": e["low"],
                    "ci_high": e["high"],
                    "mcnemar": f"{m['wins']} won / {m['losses']} lost, p={m['p']:.3f}" if m else "",
                    "wrong_writes": f"{c['wrong_writes'][0]} vs {c['wrong_writes'][1]}",
                }
            )
    return rows


def comparison_lines(comparisons: list[dict[str, Any]]) -> list[str]:
    """`tuned_candidate_constrained vs base_few_shot_constrained: task score +0.083, 95% CI [...], n=24; ...`"""
    from pipelines.stats import describe

    lines = []
    for c in comparisons:
        parts = [
            describe(c["metrics"][m], m.replace("_", " "))
            for m in ("task", "exact_match", "arg_f1")
            if (c["metrics"].get(m) or {}).get("n")
        ]
        lines.append(
            f"{c['condition']} vs {c['reference']}: "
            + "; ".join(parts)
            + f"; wrong writes {c['wrong_writes'][0]} vs {c['wrong_writes'][1]}"
        )
    return lines


def render_html(report: EvalReport) -> str:
    sections = [("Conditions", table_html(report.table()) + _quality_plot(report) + _cost_plot(report))]
    if report.comparisons:
        sections.append(
            (
                "Paired comparisons (same requests, 95 % bootstrap intervals)",
                "<p>Each difference is candidate minus reference over the requests both answered; the "
                "interval resamples whole requests (paired). McNemar counts the requests where exactly "
                "one side is right.</p>" + table_html(comparison_rows(report.comparisons)),
            )
        )
    for c in report.conditions:
        body = _wrong_writes(c) + table_html(_per_tool_rows(c)) + _confusion_plot(c)
        body += "<details><summary>sample outputs</summary>" + table_html(c.samples) + "</details>"
        sections.append((f"{c.condition} ({c.model}, {c.prompt_style} prompt, {c.shots} shots)", body))
    return page(
        f"Tool-calling evaluation: {report.name}",
        sections,
        f"{report.examples} requests from {report.dataset}; greedy decoding; {report.seconds:.0f} s"
        + _grounding(report)
        + _precision(report)
        + _sampling(report),
    )


def _sampling(report: EvalReport) -> str:
    rounds = report.settings.get("sample_rounds") or []
    if not rounds:
        return ""
    return "; sample size: " + " -> ".join(f"{r['examples']} requests ({r['decision']})" for r in rounds)


def _precision(report: EvalReport) -> str:
    """What the models computed in (as served: `base_models.load_as_served`), once where they all agree."""
    used = report.settings.get("precision") or {}
    if not used:
        return ""
    kinds = sorted(set(used.values()))
    if len(kinds) == 1:
        return f"; computed in {kinds[0]}, as served"
    return "; computed as served: " + ", ".join(f"{c} {p}" for c, p in used.items())


def _grounding(report: EvalReport) -> str:
    if "grounded_ids" not in report.settings:
        return ""
    return (
        "; under the grammar a write's ids come only from the conversation"
        if report.settings["grounded_ids"]
        else "; under the grammar a write's ids are not grounded (triton.grounded_ids off)"
    )
