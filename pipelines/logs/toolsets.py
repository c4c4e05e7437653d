"""Imported toolsets: tool schemas of other agents whose logs we import (e.g. tau-bench retail).

An importer registers its tools as `<raw zone>/_toolsets/<name>.json` (a list of OpenAI tool specs);
prep and the quality gates load them, so those logs are validated against their own schemas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pipelines.logs.tools import EFFECTS, TOOLS, TOOLS_BY_NAME, catalogue_effects, effect_of, id_arguments
from pipelines.storage import glob, read_json, write_json

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")


def toolset_uri(raw_zone: str, name: str) -> str:
    return f"{raw_zone.rstrip('/')}/_toolsets/{name}.json"


def register_toolset(
    raw_zone: str, name: str, tools: list[dict[str, Any]], effects: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """Write the toolset with each tool's `effect` (read or write; from `effects`, else what the spec itself
    declares). A tool declared by neither is recorded as a write (fail safe): its name is returned so the
    import can say so."""
    if not NAME_RE.match(name):
        raise ValueError(f"toolset name {name!r}: use lowercase letters, digits, '_' or '-'")
    clashes = sorted({t["function"]["name"] for t in tools} & set(TOOLS_BY_NAME))
    if clashes:
        raise ValueError(f"toolset {name!r} redefines catalogue tools: {', '.join(clashes)}")
    entries, undeclared = [], []
    for tool in tools:
        if tool.get("type") != "function" or "parameters" not in tool.get("function", {}):
            raise ValueError(f"toolset {name!r}: every entry must be an OpenAI function tool spec")
        tool_name = tool["function"]["name"]
        effect = (effects or {}).get(tool_name) or tool.get("effect")
        if effect is None:
            undeclared.append(tool_name)
            effect = "write"
        if effect not in EFFECTS:
            raise ValueError(f"toolset {name!r}: tool {tool_name} has effect {effect!r}; expected read or write")
        entries.append({**tool, "effect": effect, "id_arguments": id_arguments(tool)})
    return write_json(toolset_uri(raw_zone, name), entries), sorted(undeclared)


def toolsets(raw_zone: str) -> dict[str, list[dict[str, Any]]]:
    """Every registered toolset by name, as written (specs with their effect)."""
    return {
        uri.rsplit("/", 1)[-1].removesuffix(".json"): read_json(uri)
        for uri in sorted(glob(f"{raw_zone.rstrip('/')}/_toolsets/*.json"))
    }


def tool_effects(raw_zone: str) -> dict[str, str]:
    """Tool -> read/write for our catalogue and every registered toolset (undeclared: write)."""
    found = {
        t["function"]["name"]: t.get("effect", "write") for entries in toolsets(raw_zone).values() for t in entries
    }
    return {**found, **catalogue_effects()}


def tools_table(raw_zone: str) -> list[dict[str, Any]]:
    """Every registered tool: its toolset (`catalogue` for ours), effect and identifier arguments."""
    rows = [
        {
            "tool": t["function"]["name"],
            "toolset": "catalogue",
            "effect": effect_of(t["function"]["name"]),
            "id_arguments": id_arguments(t),
        }
        for t in TOOLS
    ]
    for toolset, entries in toolsets(raw_zone).items():
        rows += [
            {
                "tool": t["function"]["name"],
                "toolset": toolset,
                "effect": t.get("effect", "write"),
                "id_arguments": t.get("id_arguments") or id_arguments(t),
            }
            for t in entries
        ]
    return rows


DECLARED = ("effect", "id_arguments")  # what a toolset file adds to each OpenAI spec


def load_extra_tools(raw_zone: str) -> list[dict[str, Any]]:
    """The registered toolsets' OpenAI tool specs, as imported (without what the toolset file adds)."""
    return [
        {k: v for k, v in tool.items() if k not in DECLARED}
        for entries in toolsets(raw_zone).values()
        for tool in entries
    ]


def registered_catalogue(raw_zone: str) -> dict[str, dict[str, Any]]:
    """Our catalogue plus every toolset registered under this raw zone: what `prepare_line` must be
    given wherever raw lines are read (prep, evaluation on a log file, the drift monitor)."""
    from pipelines.logs.tools import catalogue

    return catalogue(load_extra_tools(raw_zone))


def extra_tool_names(raw_zone: str) -> list[str]:
    return sorted({t["function"]["name"] for t in load_extra_tools(raw_zone)})
