"""The promotion gate: a pure function of evaluation rows (same requests) and `promotion` settings.

The candidate is compared with a reference row: the champion's, or, with no champion yet, the
`base_few_shot` row (the base model with retrieved in-context examples: what would be served
without a tuned model). It passes only if, against that reference:

- the **task score** rises by at least `min_score_gain` and argument F1 does not fall by more than
  `min_arg_f1_gain` allows. The task score is each tool's metric (below) averaged over the examples,
  weighted by each tool's count: exact match where every tool is judged on exact match, but a window
  of free-text searches (WebShop: no two people type the same query) is scored on query text F1,
  where exact match would be 0 for every condition and decide nothing;
- p50 latency rises by at most `max_latency_increase` (against few-shot too: the tuned model must
  not be slower than the prompt-engineered alternative);
- it makes no more wrong writes than the reference (`max_extra_wrong_writes`, default 0): a write the request
  did not ask for (another write tool, other ids, or a write where a read or no call was expected) vetoes the
  promotion whatever the task score, and the reason names them;
- no tool with at least `min_tool_examples` examples in both rows loses more than
  `max_tool_regression` of its metric (no tool may collapse while the average rises). A tool's
  metric is `promotion.tool_metrics[tool]`, exact match for a tool not named there: a search is
  judged on the token F1 of its query (`text_f1`: a reworded query is not a failure), an order
  tool on exact ids. A tool whose chosen metric is missing from either row falls back to exact
  match; the metric each tool was judged on is recorded in `numbers["tool_metrics"]`.

With no champion and no `base_few_shot` row (baselines not evaluated) nothing is promoted, unless
`promotion.baseline` is `none` (plumbing smoke tests with an untrained model only). The verdict's
`numbers` hold every compared number, overall and per tool; its `reason` is one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipelines.config import Settings

BASELINE = "base_few_shot"  # the condition name in pipelines/evaluate/pipeline.py
OVERALL = ("exact_match", "arg_f1", "latency_ms_p50")
DEFAULT_TOOL_METRIC = "exact_match"
METRIC_LABELS = {"exact_match": "exact match", "text_f1": "text F1", "arg_f1": "arg F1"}


@dataclass
class Verdict:
    promoted: bool
    reason: str  # one line
    compared_with: str | None  # "champion", "base_few_shot", or None (nothing compared)
    numbers: dict[str, Any]
    decision: str = ""  # promoted, refused, or undecided (the interval cannot tell yet: evaluate more)

    def __post_init__(self) -> None:
        if not self.decision:
            self.decision = "promoted" if self.promoted else "refused"


def last_look(verdict: Verdict, ceiling: int) -> Verdict:
    """The registry's decision on the DAG's last evaluation: the DAG doubles the sample while the gate is
    undecided and stops at `evaluation.examples` (or when the split runs out), so an undecided verdict here is
    final: not promoted, and the reason says so instead of asking for more requests."""
    if verdict.decision != "undecided":
        return verdict
    rest = verdict.reason.removeprefix("undecided ").replace(": evaluate more:", ":", 1)
    return Verdict(
        False,
        f"not promoted: quality not shown to hold at the last look (the sample stops at "
        f"evaluation.examples = {ceiling}; a larger one may decide): {rest}",
        verdict.compared_with,
        verdict.numbers,
        decision="undecided",
    )


def _tool_count(stats: dict[str, Any]) -> int:
    return int(stats.get("n", stats.get("examples")) or 0)


def tool_metric(tool: str, candidate: dict[str, Any], reference: dict[str, Any], settings: Settings) -> str:
    """The metric `tool` is judged on: `promotion.tool_metrics[tool]` (exact match when not named),
    or exact match when either row lacks the chosen metric (e.g. a report from before it existed)."""
    chosen = settings.promotion.tool_metrics.get(tool, DEFAULT_TOOL_METRIC)
    if candidate.get(chosen) is None or reference.get(chosen) is None:
        return DEFAULT_TOOL_METRIC
    return chosen


def per_tool_numbers(
    candidate: dict[str, Any], reference: dict[str, Any], settings: Settings
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Per tool: [candidate, reference] counts, exact match, arg F1 and, when judged on another metric,
    that metric, and whether it was checked; the metric each tool was judged on; and one failure line
    per tool whose metric regressed beyond the tolerance."""
    p = settings.promotion
    ours, theirs = candidate.get("per_tool") or {}, reference.get("per_tool") or {}
    numbers: dict[str, Any] = {}
    judged_on: dict[str, str] = {}
    failures: list[str] = []
    for tool in sorted(set(ours) | set(theirs)):
        c: dict[str, Any] = ours.get(tool) or {}
        r: dict[str, Any] = theirs.get(tool) or {}
        n = [_tool_count(c), _tool_count(r)]
        metric = judged_on[tool] = tool_metric(tool, c, r, settings)
        c_value, r_value = c.get(metric), r.get(metric)
        values = [c_value, r_value]
        # the floor keeps noise out (one example of a tool is a 1.00 -> 0.00 swing); writes are guarded at any n by
        # the wrong-write veto, which counts every single wrong write
        checked = min(n) >= p.min_tool_examples and c_value is not None and r_value is not None
        numbers[tool] = {
            "n": n,
            "exact_match": [c.get("exact_match"), r.get("exact_match")],
            "arg_f1": [c.get("arg_f1"), r.get("arg_f1")],
            metric: values,
            "checked": checked,
        }
        if checked and c_value is not None and r_value is not None and r_value - c_value > p.max_tool_regression + 1e-9:
            failures.append(
                f"{tool} {METRIC_LABELS.get(metric, metric)} {values[1]:.2f} -> {values[0]:.2f} "
                f"(drop > {p.max_tool_regression:.2f}, n={n[0]})"
            )
    return numbers, judged_on, failures


def task_score(row: dict[str, Any], judged_on: dict[str, str]) -> float:
    """Each tool's judged metric, weighted by its example count; a row without per-tool numbers
    (or without counts) is its exact match."""
    tools = {t: s for t, s in (row.get("per_tool") or {}).items() if _tool_count(s)}
    if not tools:
        return float(row.get("exact_match") or 0.0)
    total = sum(_tool_count(s) for s in tools.values())
    return (
        sum(_tool_count(s) * float(s.get(judged_on.get(t, DEFAULT_TOOL_METRIC)) or 0.0) for t, s in tools.items())
        / total
    )


def wrong_write_veto(candidate: dict[str, Any], reference: dict[str, Any], margin: int) -> str | None:
    """The refusal line when the candidate makes more wrong writes than the reference on the same requests
    (beyond `margin`), whatever its task score; None when it does not (or a row does not count them)."""
    ours, theirs = candidate.get("wrong_writes"), reference.get("wrong_writes")
    if ours is None or theirs is None or ours <= theirs + margin:
        return None
    pairs = ", ".join(
        f"{pair} x{count}" if count > 1 else pair for pair, count in (candidate.get("wrong_write_pairs") or {}).items()
    )
    n = [candidate.get("examples"), reference.get("examples")]
    return f"refused: wrong writes {ours} of {n[0] or '?'} vs {theirs} of {n[1] or '?'}" + (
        f" ({pairs})" if pairs else ""
    )


def gate(
    candidate: dict[str, Any],
    champion: dict[str, Any] | None,
    settings: Settings,
    baseline: dict[str, Any] | None = None,
) -> Verdict:
    """Decide on `candidate` against `champion`, or with none, against `baseline` (the base_few_shot row).

    Rows: exact_match, arg_f1, latency_ms_p50 and optionally per_tool {tool: {n, exact_match, arg_f1, text_f1}}."""
    p = settings.promotion
    numbers: dict[str, Any] = {f"candidate_{k}": candidate.get(k) for k in OVERALL}
    if champion is not None:
        label, reference = "champion", champion
    elif p.baseline == "none":
        veto = wrong_write_veto(candidate, baseline, p.max_extra_wrong_writes) if baseline is not None else None
        if veto is not None:  # unchecked is never "more wrong writes than the base model"
            return Verdict(False, veto, BASELINE, numbers)
        return Verdict(
            True, "no champion yet; promotion.baseline=none promotes the first candidate unchecked", None, numbers
        )
    elif baseline is not None:
        label, reference = BASELINE, baseline
    else:
        return Verdict(
            False,
            f"not promoted: no champion and no {BASELINE} row to compare with "
            "(the evaluation ran without baselines); serving unchanged",
            None,
            numbers,
        )
    numbers.update({f"{label}_{k}": reference.get(k) for k in OVERALL})
    veto = wrong_write_veto(candidate, reference, p.max_extra_wrong_writes)
    if veto is not None:
        numbers["wrong_writes"] = [candidate.get("wrong_writes"), reference.get("wrong_writes")]
        return Verdict(False, veto, label, numbers)
    if p.rule == "paired" and candidate.get("per_request") and reference.get("per_request"):
        return paired_gate(candidate, reference, label, settings, numbers)
    failures = []
    tools, judged_on, tool_failures = per_tool_numbers(candidate, reference, settings)
    score = [task_score(candidate, judged_on), task_score(reference, judged_on)]
    score_gain = score[0] - score[1]
    if score_gain < p.min_score_gain:
        failures.append(f"task score gain {score_gain:+.3f} < {p.min_score_gain:+.3f}")
    gain = candidate["exact_match"] - reference["exact_match"]
    f1_gain = (candidate.get("arg_f1") or 0) - (reference.get("arg_f1") or 0)
    if f1_gain < p.min_arg_f1_gain:
        failures.append(f"arg F1 gain {f1_gain:+.3f} < {p.min_arg_f1_gain:+.3f}")
    latencies = [candidate.get("latency_ms_p50"), reference.get("latency_ms_p50")]
    measured = [v for v in latencies if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(measured) < len(latencies):
        slower = float("nan")  # not measured (no latency samples): the gate cannot say it is not slower
        failures.append(f"latency not measured on both sides ({latencies[0]} vs {latencies[1]})")
    else:
        slower = measured[0] / max(measured[1], 1e-9) - 1
        if slower > p.max_latency_increase:
            failures.append(f"latency {slower:+.0%} > {p.max_latency_increase:+.0%}")
    failures += tool_failures
    numbers.update(
        task_score=[round(v, 6) for v in score],
        score_gain=round(score_gain, 6),
        exact_match_gain=round(gain, 6),
        arg_f1_gain=round(f1_gain, 6),
        latency_change=round(slower, 6),
        per_tool=tools,
        tool_metrics=judged_on,
        thresholds=p.model_dump(),
    )
    checked = sum(1 for t in tools.values() if t["checked"])
    if failures:
        return Verdict(False, f"not promoted vs {label}: " + "; ".join(failures), label, numbers)
    per_tool = (
        f"{checked} tools checked (>= {p.min_tool_examples} examples), none down > {p.max_tool_regression:.2f}"
        if tools
        else "per-tool numbers not measured"
    )
    return Verdict(
        True,
        f"beats {label}: task score {score_gain:+.3f} (exact match {gain:+.3f}), arg F1 "
        f"{f1_gain:+.3f}, latency {slower:+.0%}; "
        f"{per_tool} (point comparison)",
        label,
        numbers,
    )


def _change(candidate: dict[str, Any], reference: dict[str, Any], key: str) -> float | None:
    values = [candidate.get(key), reference.get(key)]
    positive = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    if len(positive) < len(values):
        return None
    return positive[0] / positive[1] - 1


def planned_looks(settings: Settings) -> int:
    """How many times the DAG may look at the interval: `first_examples`, doubled up to `examples`."""
    e = settings.evaluation
    n, looks = min(e.first_examples, e.examples), 1
    while n < e.examples:
        n, looks = min(2 * n, e.examples), looks + 1
    return looks


def _paired_interval(
    candidate: dict[str, Any], reference: dict[str, Any], judged_on: dict[str, str], settings: Settings
) -> tuple[dict[str, Any], int, float]:
    """The paired comparison of the two rows' per-request scores (`stats.compare`) at the level left for one
    of the DAG's planned looks; with the looks and that level."""
    from pipelines.stats import compare

    p = settings.promotion
    looks = planned_looks(settings)
    level = 1 - (1 - p.confidence) / looks  # the error spent over the DAG's planned looks (Bonferroni)
    paired = compare(
        candidate["per_request"],
        reference["per_request"],
        judged_on,
        resamples=p.bootstrap_resamples,
        level=level,
        min_tool_examples=p.min_tool_examples,
    )
    return paired, looks, level


def _cost_line(latency: float | None, tokens: float | None) -> str:
    """The latency and prompt-token changes, as the reason states them."""
    return (
        "; ".join(f"{what} {v:+.0%}" for what, v in (("latency", latency), ("prompt tokens", tokens)) if v is not None)
        or "latency and prompt tokens not measured"
    )


def paired_gate(
    candidate: dict[str, Any], reference: dict[str, Any], label: str, settings: Settings, numbers: dict[str, Any]
) -> Verdict:
    """The paired rule on the same requests (per-request scores of both rows), on the task score's paired
    interval [low, high] at `promotion.confidence`:

    - superior: low > 0;
    - non-inferior: low > -margin (quality held), and p50 latency or prompt tokens down by `min_cost_gain`;
    - inferior: high < -margin: refused;
    - otherwise undecided (the interval spans -margin, or it is no cheaper and a gain over the margin is
      not ruled out): not promoted, and the DAG evaluates more requests up to `evaluation.examples`.
    Every promotion also needs latency measured and not above `max_latency_increase`. The interval's level
    is `promotion.confidence` spread over the DAG's planned looks (24, 48, 96: three looks, 98.3 % each), so
    looking again while undecided does not inflate the error.

    A promoted candidate must also keep every tool with enough examples within `max_tool_regression` (point
    check, its interval recorded beside it). The reason names the rule, the interval and n."""
    from pipelines.stats import describe

    p = settings.promotion
    tools, judged_on, tool_failures = per_tool_numbers(candidate, reference, settings)
    paired, looks, level = _paired_interval(candidate, reference, judged_on, settings)
    task = paired["metrics"]["task"]
    latency, tokens = (
        _change(candidate, reference, "latency_ms_p50"),
        _change(candidate, reference, "prompt_tokens_mean"),
    )
    numbers.update(
        paired=paired,
        per_tool=tools,
        tool_metrics=judged_on,
        latency_change=latency,
        prompt_tokens_change=tokens,
        thresholds=p.model_dump(),
        looks=looks,
        level=level,
    )
    stated = describe(task, "task score")
    margin = f"margin {p.non_inferiority_margin:.2f}"
    cost = _cost_line(latency, tokens)
    if not task["n"]:
        return Verdict(False, f"not promoted vs {label}: no request answered by both", label, numbers)
    if task["high"] < -p.non_inferiority_margin:
        return Verdict(False, f"refused: inferior to {label}: {stated} (below -{margin}); {cost}", label, numbers)
    if task["low"] <= -p.non_inferiority_margin:
        return Verdict(
            False,
            f"undecided vs {label}: evaluate more: {stated} spans -{p.non_inferiority_margin:.2f}; {cost}",
            label,
            numbers,
            decision="undecided",
        )
    superior = task["low"] > 0
    if latency is None:  # every promotion needs its latency measured on both sides
        return Verdict(False, f"refused vs {label}: latency not measured on both sides ({stated})", label, numbers)
    if latency > p.max_latency_increase:
        return Verdict(
            False,
            f"refused vs {label}: slower: latency {latency:+.0%} > {p.max_latency_increase:+.0%} ({stated})",
            label,
            numbers,
        )
    cheaper = any(v is not None and v <= -p.min_cost_gain for v in (latency, tokens))
    if not superior and not cheaper:
        if task["high"] > p.non_inferiority_margin:  # a real gain is still possible: more requests may show it
            return Verdict(
                False,
                f"undecided vs {label}: evaluate more: {stated}, no cheaper ({cost}), and a gain "
                f"over {p.non_inferiority_margin:.2f} not ruled out",
                label,
                numbers,
                decision="undecided",
            )
        return Verdict(
            False,
            f"refused: non-inferior to {label} ({stated}, {margin}) but neither latency nor "
            f"prompt tokens fall by {p.min_cost_gain:.0%} ({cost}): no reason to change",
            label,
            numbers,
        )
    if tool_failures:
        return Verdict(False, f"refused vs {label}: " + "; ".join(tool_failures) + f" ({stated})", label, numbers)
    rule = "superior" if superior else f"non-inferior ({margin})"
    return Verdict(
        True,
        f"{rule} to {label}: {stated}; {cost}; wrong writes {paired['wrong_writes'][0]} vs {paired['wrong_writes'][1]}",
        label,
        numbers,
    )


SFT = "tuned_sft"  # the SFT adapter a tune method trained further (evaluated beside the candidate)


def sft_veto(candidate: dict[str, Any], sft: dict[str, Any] | None, settings: Settings) -> str | None:
    """The refusal line when a tuned candidate does worse than its own SFT adapter on the same requests: more
    wrong writes (beyond `max_extra_wrong_writes`), or a paired task score whose interval reaches below
    -non_inferiority_margin (not shown to hold); None when it holds, when nothing was tuned (`sft` None), or
    with `promotion.sft_rule` off."""
    from pipelines.stats import compare

    p = settings.promotion
    if sft is None or not p.sft_rule:
        return None
    veto = wrong_write_veto(candidate, sft, p.max_extra_wrong_writes)
    if veto is not None:
        return f"{veto} against its SFT adapter ({SFT})"
    if not (candidate.get("per_request") and sft.get("per_request")):
        return f"refused: the tuned candidate's requests cannot be paired with its SFT adapter's ({SFT})"
    _, judged_on, _ = per_tool_numbers(candidate, sft, settings)
    task = compare(
        candidate["per_request"], sft["per_request"], judged_on, resamples=p.bootstrap_resamples, level=p.confidence
    )["metrics"]["task"]
    if task["low"] is None or task["low"] <= -p.non_inferiority_margin:
        return (
            f"refused: the tuned candidate is not shown non-inferior to its SFT adapter ({SFT}, margin "
            f"{p.non_inferiority_margin:.2f}): task score {task['diff']}, {p.confidence:.0%} CI "
            f"[{task['low']}, {task['high']}], n={task['n']}"
        )
    return None
