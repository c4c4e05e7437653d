"""An evaluation's results: one row per condition (model, prompt style, shots, grammar) and the report
that holds them; the pipeline fills them, the HTML report renders them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ConditionResult:
    condition: str
    model: str
    prompt_style: str
    shots: int
    summary: dict[str, Any]
    stats: dict[str, float]
    per_tool: dict[str, dict[str, Any]]
    confusion: dict[str, dict[str, int]]
    samples: list[dict[str, Any]] = field(default_factory=list)
    constrained: bool = False
    wrong_writes: list[dict[str, Any]] = field(default_factory=list)  # every one, request by request
    # every request's scores (record_id, tool, exact_match, name_match, arg_f1, text_f1, wrong_write): what the
    # paired comparisons (evaluate.paired) and the gate's intervals are computed from
    per_request: list[dict[str, Any]] = field(default_factory=list)


# the side-by-side table's quality columns (text_f1: token F1 of free-text arguments, next to exact match;
# wrong writes: a write the request did not ask for, counted apart from every other error)
TABLE_METRICS = (
    "exact_match",
    "text_f1",
    "name_accuracy",
    "arg_f1",
    "json_valid",
    "abstention_recall",
    "wrong_writes",
    "wrong_write_rate",
)


@dataclass
class EvalReport:
    name: str
    dataset: str
    examples: int
    conditions: list[ConditionResult]
    json_uri: str = ""
    html_uri: str = ""
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)  # how it was decoded: budget, shots, seed, grammar, ids
    comparisons: list[dict[str, Any]] = field(default_factory=list)  # paired differences (evaluate.paired.compare)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> list[dict[str, Any]]:
        return [
            {"condition": c.condition, **{k: c.summary.get(k) for k in TABLE_METRICS}, **c.stats}
            for c in self.conditions
        ]
