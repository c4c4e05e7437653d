"""Whose answer a record's label is, and whether it may train (the flywheel never learns from itself).

Every record says who wrote its answer (`label_source`: teacher, champion, human, import, generated,
verified; a record from before the field is inferred: a gateway capture is ours, anything else the production
agent's large model, the teacher). The policy (`quality.train_label_sources`, default teacher, human, import
and generated) decides what trains:

- a down-rated answer never trains, whoever wrote it: it waits in the review queue (`flywheel labels`),
  where a person's correction becomes a `human` label;
- our own models' answers (`champion`: the champion, a candidate or the base route, as served) train only
  when a person confirmed them (rated up);
- `verified`: our model's steps in an episode the environment judged successful (rejection sampling,
  `flywheel eval --episodes --keep-successes`) train only when the policy names the source (not by default);
- every other source trains when the policy names it.

A record that does not train is `held` (with its reason) in the clean logs: nothing is lost, and the drift
monitor still sees the traffic.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from pipelines.logs.schema import LABEL_SOURCES

TRAINED_BY_DEFAULT = ("teacher", "human", "import", "generated")
# labels our own model did not write: the quality gate wants most of a window's examples from these (a
# `verified` episode is our model's own answer, judged by the environment: not a trusted label)
TRUSTED_LABEL_SOURCES = tuple(source for source in LABEL_SOURCES if source not in ("champion", "verified"))


def label_source(record: Mapping[str, Any]) -> str:
    declared = record.get("label_source")
    if declared in LABEL_SOURCES:
        return str(declared)
    if str(record.get("model") or "").startswith("teacher:"):
        return "teacher"
    if str(record.get("record_id") or "").startswith("chatcmpl-"):  # a gateway capture from before the field
        return "champion"
    return "teacher"  # the production agent's own logs: the large model's answers


def held_reason(source: str, feedback: str | None, trained: Collection[str] = TRAINED_BY_DEFAULT) -> str | None:
    """Why a clean record does not train (None: it trains)."""
    if feedback == "down":
        return "rated down: waits for review"
    if source == "champion":
        return None if feedback == "up" else "our own model's answer, not confirmed by a person"
    if source not in trained:
        return f"label source {source} does not train (quality.train_label_sources)"
    return None
