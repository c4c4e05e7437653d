"""A tool call as text: the one answer format models are trained on, served with and scored by.

An answer is one compact JSON object, name first: `{"name":"<tool>","arguments":{...}}`, or
`{"name":null}` when no offered tool fits (an abstention, `NO_TOOL` as an expected tool).
"""

from __future__ import annotations

import json
from typing import Any

from pipelines.logs.tools import NO_TOOL

INVALID = "<invalid>"  # the "predicted tool" of an output that is no call at all

__all__ = ["INVALID", "NO_TOOL", "call_text", "parse_call", "schema_breach", "target_json"]


def target_json(tool: str, arguments: dict[str, Any] | None) -> str:
    if tool == NO_TOOL:
        return json.dumps({"name": None})
    return json.dumps({"name": tool, "arguments": arguments or {}}, separators=(",", ":"), sort_keys=True)


def call_text(target: str) -> str:
    """The answer text a model is trained to write and the server returns: name first, then arguments,
    compact (the one serialization the tool-call grammar admits; `{"name":null}` when no tool fits)."""
    call = json.loads(target)
    if call.get("name") is None:
        return json.dumps({"name": None}, separators=(",", ":"))  # compact, like every call
    return json.dumps({"name": call["name"], "arguments": call.get("arguments") or {}}, separators=(",", ":"),
                      ensure_ascii=False)


def parse_call(text: str) -> dict[str, Any] | None:
    """The first JSON object in `text` that looks like a call; None when there is none."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict) and "name" in value and (value["name"] is None or isinstance(value["name"], str)):
            args = value.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return None
            if not isinstance(args, dict):
                return None
            return {"name": value["name"], "arguments": args if value["name"] is not None else {}}
        start = text.find("{", start + 1)
    return None


def schema_breach(name: str, arguments: Any, parameters: dict[str, Any] | None) -> str | None:
    """Where a call of tool `name` breaks the tool's whole parameters schema when the grammar enforces it only
    in part (`grammar.partly_constrained`: a keyword it lacks, e.g. `uniqueItems`, is checked after decoding):
    the first failing argument's path (never its value); None when the tool is fully enforced or the call
    fits. The gateway never passes such a call on, and evaluation scores it as no call."""
    from pipelines.logs.tools import argument_errors
    from pipelines.toolcall.grammar import GrammarError, partly_constrained

    try:
        if name not in partly_constrained([{"name": name, "parameters": parameters or {}}]):
            return None
    except GrammarError:  # a schema the grammar cannot compile: the request is refused before decoding
        return None
    errors = argument_errors(name, arguments, {name: {"function": {"parameters": parameters or {}}}})
    return errors[0].split(":", 1)[0] if errors else None
