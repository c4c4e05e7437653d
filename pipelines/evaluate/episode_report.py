"""The episode report: pass^k per condition (plot + table), the paired comparisons, the skipped tasks, and every
greedy episode with its trajectory, where it left the gold path, the final-state difference and its wrong writes."""

from __future__ import annotations

import html
import json
from typing import Any

from pipelines.config import Settings
from pipelines.reports import figure_html, new_figure, page, table_html
from pipelines.storage import makedirs, write_json, write_text

SUMMARY_SKIP = ("per_task",)


def _pass_plot(report: dict[str, Any]) -> str:
    k = report["settings"]["k"]
    conditions = report["conditions"]
    if not conditions:
        return ""
    fig, ax = new_figure(7, 3.2)
    metrics = ["closed_loop_pass^1", f"closed_loop_pass^{k}", "teacher_forced_pass^1", f"teacher_forced_pass^{k}"]
    width = 0.8 / max(1, len(conditions))
    for i, (name, row) in enumerate(conditions.items()):
        values = [float("nan") if row.get(m) is None else row[m] for m in metrics]  # not measured: no bar
        ax.bar([j + i * width for j in range(len(metrics))], values, width, label=name)
    ax.set_xticks([j + width * (len(conditions) - 1) / 2 for j in range(len(metrics))], metrics, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share of tasks")
    ax.legend(fontsize=8)
    return figure_html(fig, "pass^1 and pass^k per condition, closed loop and teacher-forced")


def _comparison_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in report["comparisons"]:
        for metric, e in c["metrics"].items():
            rows.append(
                {
                    "condition": c["condition"],
                    "reference": c["reference"],
                    "metric": metric,
                    "n": e.get("n"),
                    "difference": e.get("diff"),
                    "95% low": e.get("low"),
                    "95% high": e.get("high"),
                    "wrong writes (ours, theirs)": c["wrong_writes"],
                }
            )
    return rows


def _call(call: dict[str, Any] | None) -> str:
    return "no call" if call is None else json.dumps(call, separators=(",", ":"))[:300]


def _episode_html(ep: dict[str, Any]) -> str:
    red = ' style="color:#b00"'
    steps = "".join(
        f"<li{red if s.get('wrong_write') else ''}>"
        f"<code>{html.escape(_call(s.get('call')))}</code>"
        + (" <b>wrong write</b>" if s.get("wrong_write") else "")
        + (
            f" → {html.escape(str(s.get('result', ''))[:200])}"
            if s.get("call")
            else f" {html.escape(s.get('text', '')[:200])}"
        )
        + "</li>"
        for s in ep["steps"]
    )
    diff = "; ".join(f"{d['table']} {d['key']}: {', '.join(d['fields'])}" for d in ep.get("state_diff") or [])
    verdict = "passed" if ep["success"] else "failed"
    head = (
        f"{html.escape(ep['task_id'])}: {verdict}, ended {html.escape(ep['end'])}, "
        f"left the gold path at step {ep['left_gold_at'] if ep['left_gold_at'] is not None else '-'}, "
        f"{ep['wrong_writes']} wrong writes"
    )
    extra = (f"<p>error: {html.escape(ep['error'])}</p>" if ep.get("error") else "") + (
        f"<p>final state differs from the gold: {html.escape(diff)}</p>" if diff else ""
    )
    return f"<details><summary>{head}</summary><ol start=0>{steps}</ol>{extra}</details>"


def render_episode_html(report: dict[str, Any]) -> str:
    summary = [{k: v for k, v in row.items() if k not in SUMMARY_SKIP} for row in report["conditions"].values()]
    sections = [
        ("pass^k", _pass_plot(report) + table_html(summary)),
        ("Paired comparisons (95 % intervals over tasks)", table_html(_comparison_rows(report))),
        ("Tasks skipped (never scored as a model failure)", table_html(report["skipped"])),
    ]
    for name, eps in report["episodes"].items():
        sections.append((f"Episodes: {name} (greedy)", "".join(_episode_html(ep) for ep in eps) or "<p>(none)</p>"))
    cut = (
        " Stopped at the time budget: the report holds the episodes that finished."
        if report["cut_by_time_budget"]
        else ""
    )
    subtitle = (
        f"{report['scored']} of {report['tasks']} tasks scored ({report['gold_changes_state']} change the state), "
        f"environment {report['environment']}, k = {report['settings']['k']}, "
        f"temperature {report['settings']['temperature']}.{cut}"
    )
    return page(f"Episodes: {report['name']}", sections, subtitle)


def write_episode_report(settings: Settings, report: dict[str, Any]) -> dict[str, Any]:
    folder = f"{settings.zone('reports')}/episodes/{report['name']}"
    makedirs(folder)
    report["json_uri"], report["html_uri"] = f"{folder}/report.json", f"{folder}/report.html"
    write_json(report["json_uri"], report)
    write_text(report["html_uri"], render_episode_html(report))
    return report
