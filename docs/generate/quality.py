"""Quality renderer: the real-data evaluation (bench/real_data.py), one subsection per case, with the paired
95 % intervals of the tuned model against its baselines as the evaluation recorded them."""

from __future__ import annotations

from typing import Any

from docs.generate.md import Body, Fmt, columns, details, mapping, ms, num, pair, pct, pp, signed, table, text
from docs.generate.result import Result

SHARES = {"exact_match", "name_accuracy", "json_valid", "wrong_write_rate"}
METRICS = ("task", "exact_match", "name_accuracy", "arg_f1", "text_f1")


def real_data(result: Result) -> Body:
    cases = result.data["cases"]
    what = (
        "Held-out quality on real data, per case: exact match, tool-name accuracy, argument F1, valid JSON and "
        "wrong writes of the base model (zero- and few-shot) and the tuned adapter, and the promotion gate's "
        "verdict from paired 95 % intervals."
    )
    blocks = []
    for name, case in cases.items():
        blocks += case_blocks(name, case)
    return Body(what, blocks)


def case_blocks(name: str, case: dict[str, Any]) -> list[str]:
    commit = case.get("commit") or {}
    sha = commit.get("sha", "") if isinstance(commit, dict) else str(commit)
    dirty = " (working tree dirty)" if isinstance(commit, dict) and commit.get("dirty") else ""
    head = (
        f"#### case `{name}`\n\n"
        f"Run at commit `{sha[:7] or 'not recorded'}`{dirty}; n = {case.get('examples')} held-out examples; "
        f"promoted: {num(case.get('promoted'))}; {num(case.get('seconds'))} s."
    )
    rows_spec: list[tuple[str, str, Fmt]] = [
        ("condition", "condition", text),
        ("exact match", "exact_match", pct),
        ("tool name", "name_accuracy", pct),
        ("argument F1", "arg_f1", num),
        ("valid JSON", "json_valid", pct),
        ("wrong writes", "wrong_writes", num),
        ("prompt tokens", "prompt_tokens", num),
        ("latency p50 ms", "latency_ms_p50", ms),
        ("latency n", "latency_n", num),
    ]
    blocks = [head, columns(case.get("rows", []), rows_spec)]
    blocks += [comparisons(case.get("comparisons", [])), verdict(case.get("verdict") or {})]
    evaluation = {f"eval.{k}": v for k, v in (case.get("eval_settings") or {}).items()}
    settings = {**(case.get("settings") or {}), **evaluation}
    if settings:
        blocks.append(details(f"settings of {name}", mapping(settings)))
    return [b for b in blocks if b]


def comparisons(comps: list[dict[str, Any]]) -> str:
    rows = []
    for c in comps:
        for metric in [m for m in METRICS if m in c["metrics"]] + [m for m in c["metrics"] if m not in METRICS]:
            m = c["metrics"][metric]
            fmt = pp if metric in SHARES else signed
            rows.append(
                [
                    f"{c['condition']} - {c['reference']}",
                    metric,
                    m.get("n"),
                    fmt(m.get("diff")),
                    pair([m.get("low"), m.get("high")], fmt),
                    mcnemar(m.get("mcnemar")),
                ]
            )
    if not rows:
        return ""
    headers = ["comparison", "metric", "n", "difference", "paired 95 % interval", "McNemar wins / losses (p)"]
    return "Paired comparisons on the same examples:\n\n" + table(headers, rows)


def mcnemar(m: dict[str, Any] | None) -> str:
    return "" if not m else f"{m['wins']} / {m['losses']} (p = {num(m['p'])})"


def verdict(v: dict[str, Any]) -> str:
    if not v:
        return ""
    checks = ", ".join(f"{k} {'yes' if ok else 'no'}" for k, ok in (v.get("checks") or {}).items())
    return f"Verdict: met {num(v.get('met'))} against `{v.get('against')}` ({v.get('rule')}); checks: {checks}."


def episodes(result: Result) -> Body:
    """bench/episodes.py: whole retail conversations per condition, and the champion paired with each base prompt."""
    d = result.data
    k = (d.get("settings") or {}).get("episodes", {}).get("k", 4)
    what = (
        "Whole tau-bench retail conversations against the live environment, on tasks never trained on: closed-loop "
        f"success (pass^1 greedy, pass^{k} from {k} sampled tries), teacher-forced steps, wrong writes, prompt "
        "tokens and seconds per episode; the champion paired per task with each base prompt."
    )
    split = d.get("split") or {}
    runs = d.get("runs") or {}
    cut = [name for name, r in runs.items() if r.get("cut_by_time_budget")]
    head = (
        f"Champion v{d.get('version')}; {num(split.get('evaluated_tasks'))} evaluated tasks "
        f"({num(runs.get('tuned', {}).get('scored'))} scored, {num(runs.get('tuned', {}).get('skipped'))} skipped: "
        f"unreadable, or a gold the database refuses), {num(split.get('train_tasks'))} training tasks. "
        + (f"Cut by its time budget: {', '.join(cut)} run (a condition's `tasks` is how many it finished)." if cut
           else "No run was cut by its time budget.")
    )  # fmt: skip
    spec: list[tuple[str, str, Fmt]] = [
        ("condition", "condition", text),
        ("tasks", "tasks", num),
        ("closed loop pass^1", "closed_loop_pass^1", pct),
        (f"closed loop pass^{k}", f"closed_loop_pass^{k}", pct),
        ("teacher-forced steps exact", "teacher_forced_step_exact", pct),
        ("reads exact", "teacher_forced_read_exact", pct),
        ("writes exact", "teacher_forced_write_exact", pct),
        ("gold path p (pass^1)", "teacher_forced_pass^1", num),
        ("wrong writes", "wrong_writes", num),
        ("wrong writes / episode", "wrong_writes_per_episode", num),
        ("prompt tokens / episode", "prompt_tokens_per_episode", num),
        ("s / episode", "seconds_per_episode", num),
        ("cut", "cut_by_time_budget", num),
    ]
    rows = list((d.get("conditions") or {}).values())
    blocks = [head, columns(rows, spec), episode_comparisons(d.get("comparisons") or [])]
    if d.get("settings"):
        blocks.append(details("settings", mapping(d["settings"])))
    return Body(what, [b for b in blocks if b])


def episode_comparisons(comps: list[dict[str, Any]]) -> str:
    rows = []
    for c in comps:
        for metric, m in c["metrics"].items():
            if m.get("n"):
                rows.append([f"{c['condition']} - {c['reference']}", metric, m.get("n"), pp(m.get("diff")),
                             pair([m.get("low"), m.get("high")], pp), mcnemar(m.get("mcnemar"))])  # fmt: skip
        ours, theirs = c.get("wrong_writes") or [None, None]
        rows.append([f"{c['condition']} - {c['reference']}", "wrong writes (episodes)", c.get("n"),
                     f"{num(ours)} vs {num(theirs)}", "", ""])  # fmt: skip
    if not rows:
        return ""
    headers = ["comparison", "metric", "tasks", "difference", "paired 95 % interval", "McNemar wins / losses (p)"]
    return "Paired per task, on the tasks both finished:\n\n" + table(headers, rows)
