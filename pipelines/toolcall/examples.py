"""Curated rows as chat examples in one of three prompt styles (see `prompt.py`): what training,
evaluation, the sweep's validation and the gateway's few-shot pool all build the same way.

`full` is the logged system prompt with every offered tool's JSON schema (what a base model needs),
`short` tool signatures with allowed values, date and customer context, `names` only the offered tools'
names, date and context: what tuned models are trained and served with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipelines.toolcall.calls import NO_TOOL, call_text
from pipelines.toolcall.prompt import PromptStyle, chat_turns, system_for

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PROMPT_STYLE_FILE", "Example", "PromptStyle", "to_examples", "training_pairs"]

PROMPT_STYLE_FILE = "flywheel_prompt_style"  # in an adapter folder: the prompt style it was trained with


@dataclass(frozen=True)
class Example:
    record_id: str
    turns: list[dict[str, str]]  # system + conversation, ending with the user turn to answer
    target: str  # the call text the model should write (name first)
    tool: str  # expected tool, or NO_TOOL for an abstention
    query: str  # the last user message (few-shot retrieval key)
    tools: str  # the offered tools (prompt.tools_json): the constrained decoder's grammar

    @property
    def expected(self) -> dict[str, Any]:
        return json.loads(self.target)


def to_examples(frame: pd.DataFrame, style: PromptStyle) -> list[Example]:
    out = []
    for row in frame.to_dict("records"):
        turns = chat_turns(system_for(row, style), row["messages_json"])
        target = call_text(row["target_json"])
        name = json.loads(target)["name"]
        out.append(
            Example(
                row["record_id"],
                turns,
                target,
                name if name is not None else NO_TOOL,
                turns[-1]["content"],
                row["tools_json"],
            )
        )
    return out


def grounded_tools(examples: list[Example], effects: Mapping[str, str] | None, grounded: bool = True) -> list[str]:
    """Each example's offered tools for the grammar, with write ids limited to what its own conversation
    states (`toolcall.grounding`; never a few-shot example's) unless `grounded` is off."""
    if not grounded:
        return [e.tools for e in examples]
    from pipelines.logs.tools import catalogue_effects
    from pipelines.toolcall.grounding import ground

    known = catalogue_effects() if effects is None else effects
    return [ground(e.tools, e.turns[1:], known) for e in examples]


def training_pairs(examples: list[Example]) -> list[tuple[list[dict[str, str]], str]]:
    return [(e.turns, e.target) for e in examples]
