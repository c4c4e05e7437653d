"""A tool call as text: the one answer format models are trained on, served with and scored by.

An answer is one compact JSON object, name first: `{"name":"<tool>","arguments":{...}}`, or
`{"name":null}` when no offered tool fits (an abstention, `NO_TOOL` as an expected tool).
"""

from __future__ import annotations

import json
import re
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
    return json.dumps(
        {"name": call["name"], "arguments": call.get("arguments") or {}}, separators=(",", ":"), ensure_ascii=False
    )


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


def schema_breach(
    name: str, arguments: Any, parameters: dict[str, Any] | None, admit_tokens: bool = False
) -> str | None:
    """Where a call of tool `name` breaks the tool's whole parameters schema when the grammar enforces it only
    in part (`grammar.partly_constrained`: a keyword it lacks, e.g. `uniqueItems`, is checked after decoding):
    the first failing argument's path (never its value); None when the tool is fully enforced or the call
    fits. The gateway never passes such a call on, and evaluation scores it as no call.

    `admit_tokens`: a redaction token (`<EMAIL>`, ...) is a valid value wherever the grammar admits one (a
    patterned or formatted string), as it does for answers scored against redacted targets; the gateway checks
    after restoring real values and leaves it off. A pattern Python's `re` cannot read (llguidance can) is
    left to the grammar, which enforced it, and the rest of the schema is still checked."""
    from pipelines.logs.tools import validation_errors
    from pipelines.toolcall.grammar import REDACTION_TOKENS, GrammarError, partly_constrained

    schema = parameters or {}
    try:
        if name not in partly_constrained([{"name": name, "parameters": schema}]):
            return None
    except (GrammarError, ValueError):  # a schema the grammar cannot compile: refused before decoding
        return None

    def breaches(checked: Any) -> list[Any]:
        errors = validation_errors(checked, arguments)
        return [e for e in errors if not (admit_tokens and e.instance in REDACTION_TOKENS)]

    try:
        found = breaches(schema)
    except Exception:  # noqa: BLE001 (re.error on a pattern only llguidance reads, an unresolvable $ref, ...)
        try:
            found = breaches(_without_patterns(schema))
        except Exception:  # noqa: BLE001 (a schema jsonschema cannot check at all: the grammar's word stands)
            return None
    if not found:
        return None
    return "/".join(map(str, found[0].absolute_path)) or "<root>"


def _readable(pattern: Any) -> bool:
    try:
        re.compile(pattern)
    except (re.error, TypeError):
        return False
    return True


def _without_patterns(node: Any) -> Any:
    """A schema with the `pattern`s Python's `re` cannot read left out (the grammar enforced them)."""
    from pipelines.toolcall.grammar import _LITERALS

    if isinstance(node, list):
        return [_without_patterns(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "pattern" and not _readable(value):
            continue
        if key == "patternProperties" and isinstance(value, dict):
            out[key] = {k: _without_patterns(v) for k, v in value.items() if _readable(k)}
        else:
            out[key] = value if key in _LITERALS else _without_patterns(value)
    return out
