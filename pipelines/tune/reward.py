"""GRPO's verifiable reward (issue 51, item 3), computed by the evaluation's own scorer (`toolcall.score`): one
definition of a right answer for the gate, the reports and the tuning.

For one sampled answer against the expected call:

- a wrong write (`score.WRONG_WRITES`: a write of the wrong tool, of other ids, or where none was expected)
  earns `WRONG_WRITE`, a penalty larger than any gain, so a group never prefers a wrong write to any other answer;
- an answer that is not a call (`INVALID`) earns 0;
- where no tool fits, abstaining (`{"name": null}`) earns 1, any other call 0;
- otherwise the gains add up to 1 for the exact call: `JSON` for a valid call, `NAME` for the right tool, `ARGS`
  times the argument F1 and `EXACT` for the exact call (name and every argument).

A scorer that raises is never a silent zero: `RewardError` names the prompt's record id and the task fails.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pipelines.errors import DataProblem
from pipelines.toolcall.calls import NO_TOOL
from pipelines.toolcall.score import ExampleScore, score

WRONG_WRITE = -2.0
JSON, NAME, ARGS, EXACT = 0.1, 0.3, 0.3, 0.3
BEST = JSON + NAME + ARGS + EXACT  # the exact call's reward (1.0), as a right abstention's


class RewardError(DataProblem):
    """The scorer failed on one sampled answer: the message names the prompt (its record id)."""


def from_score(s: ExampleScore) -> float:
    """The reward of one scored answer (the module's rules)."""
    if s.wrong_write is not None:
        return WRONG_WRITE
    if not s.json_valid:
        return 0.0
    if s.tool == NO_TOOL:
        return BEST if s.name_match else 0.0
    return JSON + NAME * s.name_match + ARGS * (s.arg_f1 or 0.0) + EXACT * s.exact_match


def scored(
    text: str, expected: dict[str, Any] | str, effects: Mapping[str, str] | None, record_id: str
) -> ExampleScore:
    """The scorer's verdict on answer `text` to the prompt `record_id` (`expected`: the call, or its JSON)."""
    try:
        return score(text, json.loads(expected) if isinstance(expected, str) else expected, effects)
    except Exception as exc:  # any scorer failure stops the run, naming the prompt
        raise RewardError(f"grpo: the reward failed on prompt {record_id}: {type(exc).__name__}: {exc}") from exc


def reward(text: str, expected: dict[str, Any] | str, effects: Mapping[str, str] | None, record_id: str) -> float:
    """The reward of answer `text` to the prompt `record_id` whose expected call is `expected`."""
    return from_score(scored(text, expected, effects, record_id))


def rewards(
    texts: list[str],
    expected: list[dict[str, Any]],
    record_ids: list[str],
    effects: Mapping[str, str] | None = None,
) -> list[float]:
    """One reward per answer; the three lists are aligned (a length mismatch raises RewardError)."""
    if not len(texts) == len(expected) == len(record_ids):
        raise RewardError(
            f"grpo: {len(texts)} answers for {len(expected)} expected calls and {len(record_ids)} prompt ids"
        )
    return [reward(t, e, effects, r) for t, e, r in zip(texts, expected, record_ids, strict=True)]
