"""The prompt styles, shared by the dataset builder, training, evaluation, Triton's client and the gateway.

A prompt is: a system message (the date, the tools offered with their JSON schemas, the answer
format, and the customer's context from Feast when available), then the conversation (earlier user
turns, assistant tool calls, tool results), then the current user message. The target is one JSON
object: {"name": tool, "arguments": {...}} or {"name": null} when no tool fits.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Literal

from pipelines.logs.tools import TOOLS_BY_NAME
from pipelines.toolcall.calls import call_text, target_json

PromptStyle = Literal["full", "short", "names"]


def tools_json(specs: list[dict[str, Any]]) -> str:
    """The offered tools (OpenAI tool specs) as the compact JSON list the prompt shows."""
    return json.dumps(
        [
            {
                "name": s["function"]["name"],
                "description": s["function"].get("description", ""),
                "parameters": s["function"]["parameters"],
            }
            for s in specs
        ],
        separators=(",", ":"),
        sort_keys=True,
    )


def tools_json_for(names: list[str]) -> str:
    return tools_json([TOOLS_BY_NAME[n] for n in names])


def system_prompt(tools: str, day: str, context: str | None = None) -> str:
    """`tools` is `tools_json(...)` of the tools offered in the turn."""
    return _system_prompt(tools, day, context or None)


@lru_cache(maxsize=4096)
def _system_prompt(tools: str, day: str, context: str | None) -> str:
    lines = [
        f"You are the tool-calling step of a commerce assistant. Today is {day}.",
        "Tools:",
        *(json.dumps(t, separators=(",", ":"), sort_keys=True) for t in json.loads(tools)),
        'Answer with one compact JSON object: {"name":"<tool>","arguments":{...}} using values from the '
        'conversation, or {"name":null} when no tool fits.',
    ]
    if context:
        lines.append(f"Customer context: {context}")
    return "\n".join(lines)


def format_context(features: dict[str, Any]) -> str:
    """Customer features as one short line; identical for offline (training) and online (serving)."""
    if not features or features.get("last_country") is None:
        return ""
    mix = {
        k.removeprefix("share_").removesuffix("_30d"): v
        for k, v in features.items()
        if k.startswith("share_") and k.endswith("_30d") and v
    }
    top = ", ".join(f"{k} {v:.0%}" for k, v in sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))[:3])
    parts = [f"country {features['last_country']}", f"currency {features['last_currency']}"]
    if features.get("preferred_category"):
        parts.append(f"likes {features['preferred_category']}")
    if features.get("order_count_30d"):
        parts.append(f"{int(features['order_count_30d'])} orders in 30 days")
    if top:
        parts.append(f"usual requests: {top}")
    return "; ".join(parts)


def chat_turns(system: str, messages_json: str) -> list[dict[str, str]]:
    """An SFT example as plain chat turns any chat template accepts (system/user/assistant only):
    earlier assistant tool calls become their JSON, tool results become a user turn."""
    turns = [{"role": "system", "content": system}]
    for m in json.loads(messages_json):
        if m["role"] == "assistant" and m.get("tool_calls"):
            call = m["tool_calls"][0]
            # earlier calls in the answer format itself (name first, compact), as the model writes them
            turns.append({"role": "assistant", "content": call_text(target_json(call["name"], call.get("arguments")))})
        elif m["role"] == "assistant":
            turns.append({"role": "assistant", "content": m.get("content") or ""})
        elif m["role"] == "tool":
            turns.append({"role": "user", "content": f"Tool result: {m.get('content') or ''}"})
        else:
            turns.append({"role": "user", "content": m.get("content") or ""})
    return turns


def tool_signatures(tools: str) -> str:
    """`tools_json(...)` as one compact line per tool: `name(required, optional?, enum_arg=a|b)`; no
    descriptions, types or JSON Schema syntax, but the allowed values (the model cannot guess those)."""
    out = []
    for t in json.loads(tools):
        props = t.get("parameters", {}).get("properties", {})
        required = set(t.get("parameters", {}).get("required", []))
        args = []
        for a in sorted(props, key=lambda a: (a not in required, a)):
            enum = props[a].get("enum")
            args.append(f"{a}{'' if a in required else '?'}{'=' + '|'.join(map(str, enum)) if enum else ''}")
        out.append(f"{t['name']}({', '.join(args)})")
    return "\n".join(sorted(out))


def short_system_prompt(tools: str, day: str, context: str | None = None, signatures: bool = True) -> str:
    """The tuned model's prompt: tool signatures only (the adapter learned what they mean and their value
    formats), the date and the customer context. Dropping the JSON schemas is where most of the case
    study's latency gain comes from. `signatures=False` (the `names` style) lists only the offered tools'
    names: the adapter has learned their arguments and allowed values from the logs (a new tool or value
    then needs a retrain, which is what the flywheel does), and each example is several times shorter."""
    listed = tool_signatures(tools) if signatures else ", ".join(sorted(t["name"] for t in json.loads(tools)))
    lines = [
        f"Commerce tool router. Today is {day}. Tools:",
        listed,
        'Reply with one JSON tool call, or {"name":null}.',
    ]
    if context:
        lines.append(f"Customer context: {context}")
    return "\n".join(lines)


def system_for(row: dict[str, Any], style: PromptStyle) -> str:
    if style == "full":
        return row["system_prompt"]
    day = _day(row.get("event_timestamp") or row["event_time"])
    return short_system_prompt(row["tools_json"], day, row.get("context") or None, signatures=style == "short")


def _day(value: Any) -> str:
    return value.date().isoformat() if hasattr(value, "date") else str(value)[:10]
