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
    """Wins / losses and the p-value; `stats.mcnemar` rounds p to six decimals, so a recorded 0 is below 5e-07."""
    if not m:
        return ""
    p = "p < 5e-07" if m["p"] == 0 else f"p = {num(m['p'])}"
    return f"{m['wins']} / {m['losses']} ({p})"


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


def tune_slip(result: Result) -> Body:
    """bench/slip.py: an injected teacher slip, SFT by imitation and under the label policy, and each tune method
    on top of it, on held-out requests whose truth is known; paired against SFT and imitation."""
    d = result.data
    settings = d.get("settings") or {}
    shares = settings.get("slip_ratings") or {}
    what = (
        f"Tuning from outcomes on an injected teacher slip ({settings.get('slip')}: the teacher logs the wrong tool "
        "in that share of the intent's turns, asked in the slip's own phrasings; people rate "
        f"{pct(shares.get('slipped_rated_down'))} of those down and {pct(shares.get('others_rated_up'))} of the other "
        f"answers up; a reviewer corrects {pct(settings.get('correct'))} of the down-rated ones). Each arm answers the "
        "same held-out requests with known right calls, decoded as served: the slip intent's tool-name accuracy, every "
        "other tool's exact match, wrong writes, and the acceptance rule (the slip fixed: name accuracy >= "
        f"{num(settings.get('fix_floor'))} and >= {num(settings.get('fix_gain'))} above SFT; every other tool "
        f"non-inferior to imitation at margin {num(settings.get('margin'))}; no more wrong writes)."
    )
    arms = d.get("arms") or {}
    n = next(iter(arms.values()), {}).get("n", {}) if arms else {}
    signals = d.get("signals") or {}
    head = (
        f"SFT v{(d.get('versions') or {}).get('sft')}; held-out requests: {num(n.get('slip'))} in the slip's "
        f"phrasings, {num(n.get('other'))} others; down-rated slips queued for review {num(signals.get('queued'))}, "
        f"corrected {num(signals.get('corrected'))}."
    )
    spec: list[tuple[str, str, Fmt]] = [
        ("arm", "arm", text),
        ("slip: tool name", "slip_name_accuracy", pct),
        ("slip: exact", "slip_exact_match", pct),
        ("other tools: exact", "other_exact_match", pct),
        ("wrong writes", "wrong_writes", num),
    ]
    rows = [{"arm": arm, **row} for arm, row in arms.items()]
    comps = []
    for c in d.get("comparisons") or []:
        for label, key, fmt in (("slip: tool name", "slip_name_accuracy", pp), ("other tools: exact",
                                "other_exact_match", pp)):  # fmt: skip
            m = c.get(key) or {}
            comps.append([f"{c['arm']} - {c['reference']}", label, m.get("n"), fmt(m.get("diff")),
                          pair([m.get("low"), m.get("high")], fmt), mcnemar(m if "wins" in m else None)])  # fmt: skip
    headers = ["comparison", "metric", "n", "difference", "paired 95 % interval", "McNemar wins / losses (p)"]
    acceptance = [
        [arm, _yes(a.get("slip_fixed")), _yes(a.get("others_non_inferior_pooled")),
         _yes(a.get("others_non_inferior_every_tool")), ", ".join(a.get("tools_not_shown_non_inferior") or []),
         _yes(a.get("no_more_wrong_writes")), _yes(a.get("passes")), _yes(a.get("passes_pooled"))]
        for arm, a in (d.get("acceptance") or {}).items()
    ]  # fmt: skip
    cost = [
        [m, c.get("skipped") or "", num(c.get("seconds")), num(c.get("tokens")), num(c.get("steps")),
         num(c.get("pairs") or c.get("rows") or c.get("prompts"))]
        for m, c in (d.get("cost") or {}).items()
    ]  # fmt: skip
    blocks = [
        head,
        columns(rows, spec),
        "Paired on the same held-out requests:\n\n" + table(headers, comps) if comps else "",
        "Acceptance:\n\n"
        + table(
            [
                "arm",
                "slip fixed",
                "others held (pooled)",
                "others held (every tool)",
                "tools not shown held",
                "no more wrong writes",
                "passes (every tool)",
                "passes (pooled)",
            ],
            acceptance,
        ),  # fmt: skip
        "Cost of each method (its own run):\n\n"
        + table(["method", "skipped", "seconds", "tokens trained", "steps", "rows / pairs / prompts"], cost),
        details("other tools' exact match by tool", mapping({a: r.get("other_by_tool") for a, r in arms.items()})),
    ]
    if settings:
        blocks.append(details("settings", mapping(settings)))
    return Body(what, [b for b in blocks if b])


def _yes(value: Any) -> str:
    return "n/a" if value is None else "yes" if value else "no"


def tune_retail(result: Result) -> Body:
    """bench/tune_retail.py: the SFT version and the same adapter tuned after SFT on tau-bench retail requests
    never trained on, paired per request."""
    d = result.data
    split = d.get("split") or {}
    what = (
        "Tuning after SFT on real data: tau-bench retail, the SFT version against the same adapter tuned further, on "
        "the steps of tasks never trained on, decoded as served; paired per request, wrong writes counted."
    )
    head = (
        f"SFT v{d.get('version')}; {num(split.get('requests'))} held-out requests from "
        f"{num(split.get('evaluated_tasks'))} tasks; {num(split.get('train_tasks'))} training tasks."
    )
    spec: list[tuple[str, str, Fmt]] = [
        ("condition", "condition", text),
        ("exact match", "exact_match", pct),
        ("tool name", "name_accuracy", pct),
        ("argument F1", "arg_f1", num),
        ("valid JSON", "json_valid", pct),
        ("wrong writes", "wrong_writes", num),
        ("prompt tokens", "prompt_tokens", num),
    ]
    rows = [{"condition": name, **row} for name, row in (d.get("rows") or {}).items()]
    comps = []
    for c in d.get("comparisons") or []:
        for metric, m in c["metrics"].items():
            fmt = pp if metric in SHARES else signed
            comps.append([f"{c['condition']} - {c['reference']}", metric, m.get("n"), fmt(m.get("diff")),
                          pair([m.get("low"), m.get("high")], fmt), mcnemar(m.get("mcnemar"))])  # fmt: skip
        ours, theirs = c.get("wrong_writes") or [None, None]
        comps.append([f"{c['condition']} - {c['reference']}", "wrong writes", c.get("n"),
                      f"{num(ours)} vs {num(theirs)}", "", ""])  # fmt: skip
    headers = ["comparison", "metric", "n", "difference", "paired 95 % interval", "McNemar wins / losses (p)"]
    cost = [[m, num(c.get("seconds")), num(c.get("tokens")), num(c.get("steps")),
             num(c.get("prompts") if c.get("prompts") is not None else c.get("pairs"))]
            for m, c in (d.get("cost") or {}).items()]  # fmt: skip
    not_run = (d.get("settings") or {}).get("not_run") or {}
    pairs = d.get("pairs") or {}
    if pairs:
        head += f" Preference pairs from the offline shadow run and any other source: {num(pairs.get('pairs'))}."
    blocks = [
        head,
        columns(rows, spec),
        "Paired on the same requests:\n\n" + table(headers, comps) if comps else "",
        "Cost of each method (its own run):\n\n"
        + table(["method", "seconds", "tokens trained", "steps", "prompts (GRPO) or pairs (DPO)"], cost),
        "Not run: " + "; ".join(f"{m}: {why}" for m, why in not_run.items()) + "." if not_run else "",
    ]
    if d.get("settings"):
        blocks.append(details("settings", mapping(d["settings"])))
    return Body(what, [b for b in blocks if b])
