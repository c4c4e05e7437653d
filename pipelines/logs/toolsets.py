"""Imported toolsets: tool schemas of other agents whose logs we import (e.g. tau-bench retail).

An importer registers its tools as `<raw zone>/_toolsets/<name>.json` (a list of OpenAI tool specs);
prep and the quality gates load them, so those logs are validated against their own schemas.
"""

from __future__ import annotations

import re
from typing import Any

from pipelines.logs.tools import TOOLS_BY_NAME
from pipelines.storage import glob, read_json, write_json

NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,40}$")


def toolset_uri(raw_zone: str, name: str) -> str:
    return f"{raw_zone.rstrip('/')}/_toolsets/{name}.json"


def register_toolset(raw_zone: str, name: str, tools: list[dict[str, Any]]) -> str:
    if not NAME_RE.match(name):
        raise ValueError(f"toolset name {name!r}: use lowercase letters, digits, '_' or '-'")
    clashes = sorted({t["function"]["name"] for t in tools} & set(TOOLS_BY_NAME))
    if clashes:
        raise ValueError(f"toolset {name!r} redefines catalogue tools: {', '.join(clashes)}")
    for tool in tools:
        if tool.get("type") != "function" or "parameters" not in tool.get("function", {}):
            raise ValueError(f"toolset {name!r}: every entry must be an OpenAI function tool spec")
    return write_json(toolset_uri(raw_zone, name), tools)


def load_extra_tools(raw_zone: str) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    for uri in glob(f"{raw_zone.rstrip('/')}/_toolsets/*.json"):
        tools.extend(read_json(uri))
    return tools


def registered_catalogue(raw_zone: str) -> dict[str, dict[str, Any]]:
    """Our catalogue plus every toolset registered under this raw zone: what `prepare_line` must be
    given wherever raw lines are read (prep, evaluation on a log file, the drift monitor)."""
    from pipelines.logs.tools import catalogue

    return catalogue(load_extra_tools(raw_zone))


def extra_tool_names(raw_zone: str) -> list[str]:
    return sorted({t["function"]["name"] for t in load_extra_tools(raw_zone)})
