"""The promotion gate: a pure function of evaluation rows (same requests) and `promotion` settings.

The candidate is compared with a reference row: the champion's, or, with no champion yet, the
`base_few_shot` row (the base model with retrieved in-context examples: what would be served
without a tuned model). It passes only if, against that reference:

- exact match rises by at least `min_exact_match_gain` and argument F1 by `min_arg_f1_gain`;
- p50 latency rises by at most `max_latency_increase` (against few-shot too: the tuned model must
  not be slower than the prompt-engineered alternative);
- no tool with at least `min_tool_examples` examples in both rows loses more than
  `max_tool_regression` exact match (no tool may collapse while the average rises).

With no champion and no `base_few_shot` row (baselines not evaluated) nothing is promoted, unless
`promotion.baseline` is `none` (plumbing smoke tests with an untrained model only). The verdict's
`numbers` hold every compared number, overall and per tool; its `reason` is one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.config import Settings

BASELINE = "base_few_shot"  # the condition name in pipelines/evaluate/pipeline.py
OVERALL = ("exact_match", "arg_f1", "latency_ms_p50")


@dataclass
class Verdict:
    promoted: bool
    reason: str  # one line
    compared_with: str | None  # "champion", "base_few_shot", or None (nothing compared)
    numbers: dict[str, Any]


def _tool_count(stats: dict[str, Any]) -> int:
    return int(stats.get("n", stats.get("examples")) or 0)


def per_tool_numbers(candidate: dict[str, Any], reference: dict[str, Any],
                     settings: Settings) -> tuple[dict[str, Any], list[str]]:
    """Per tool: [candidate, reference] counts, exact match and arg F1, and whether it was checked;
    plus one failure line per tool that regressed beyond the tolerance."""
    p = settings.promotion
    ours, theirs = candidate.get("per_tool") or {}, reference.get("per_tool") or {}
    numbers: dict[str, Any] = {}
    failures: list[str] = []
    for tool in sorted(set(ours) | set(theirs)):
        c, r = ours.get(tool) or {}, theirs.get(tool) or {}
        n = [_tool_count(c), _tool_count(r)]
        exact = [c.get("exact_match"), r.get("exact_match")]
        checked = min(n) >= p.min_tool_examples and None not in exact
        numbers[tool] = {"n": n, "exact_match": exact, "arg_f1": [c.get("arg_f1"), r.get("arg_f1")],
                         "checked": checked}
        if checked and exact[1] - exact[0] > p.max_tool_regression + 1e-9:
            failures.append(f"{tool} exact match {exact[1]:.2f} -> {exact[0]:.2f} "
                            f"(drop > {p.max_tool_regression:.2f}, n={n[0]})")
    return numbers, failures


def gate(candidate: dict[str, Any], champion: dict[str, Any] | None, settings: Settings,
         baseline: dict[str, Any] | None = None) -> Verdict:
    """Decide on `candidate` against `champion`, or with none, against `baseline` (the base_few_shot row).

    Rows: exact_match, arg_f1, latency_ms_p50 and optionally per_tool {tool: {n, exact_match, arg_f1}}."""
    p = settings.promotion
    numbers: dict[str, Any] = {f"candidate_{k}": candidate.get(k) for k in OVERALL}
    if champion is not None:
        label, reference = "champion", champion
    elif p.baseline == "none":
        return Verdict(True, "no champion yet; promotion.baseline=none promotes the first candidate unchecked",
                       None, numbers)
    elif baseline is not None:
        label, reference = BASELINE, baseline
    else:
        return Verdict(False, f"not promoted: no champion and no {BASELINE} row to compare with "
                              "(the evaluation ran without baselines); serving unchanged", None, numbers)
    numbers.update({f"{label}_{k}": reference.get(k) for k in OVERALL})
    failures = []
    gain = candidate["exact_match"] - reference["exact_match"]
    if gain < p.min_exact_match_gain:
        failures.append(f"exact match gain {gain:+.3f} < {p.min_exact_match_gain:+.3f}")
    f1_gain = (candidate.get("arg_f1") or 0) - (reference.get("arg_f1") or 0)
    if f1_gain < p.min_arg_f1_gain:
        failures.append(f"arg F1 gain {f1_gain:+.3f} < {p.min_arg_f1_gain:+.3f}")
    slower = candidate["latency_ms_p50"] / max(reference["latency_ms_p50"], 1e-9) - 1
    if slower > p.max_latency_increase:
        failures.append(f"latency {slower:+.0%} > {p.max_latency_increase:+.0%}")
    tools, tool_failures = per_tool_numbers(candidate, reference, settings)
    failures += tool_failures
    numbers.update(exact_match_gain=round(gain, 6), arg_f1_gain=round(f1_gain, 6), latency_change=round(slower, 6),
                   per_tool=tools, thresholds=p.model_dump())
    checked = sum(1 for t in tools.values() if t["checked"])
    if failures:
        return Verdict(False, f"not promoted vs {label}: " + "; ".join(failures), label, numbers)
    per_tool = (f"{checked} tools checked (>= {p.min_tool_examples} examples), none down > {p.max_tool_regression:.2f}"
                if tools else "per-tool numbers not measured")
    return Verdict(True, f"beats {label}: exact match {gain:+.3f}, arg F1 {f1_gain:+.3f}, latency {slower:+.0%}; "
                         f"{per_tool}", label, numbers)
