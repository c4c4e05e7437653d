"""Grounded ids: under the grammar, a write tool's identifier argument can only take a value the
conversation states (the user's words and the tool results), so the decoder cannot invent an order id.

Which tools write and which of their arguments are ids comes from the toolset registry (`logs.tools`
declares ours, an imported toolset declares its own; undeclared is a write). The same function grounds the
tools for evaluation, the sweep's validation, the deploy smoke test and every served request
(`serve.prompts.offered_tools`), so a model is measured the way it is served. `triton.grounded_ids: false`
turns it off for a toolset whose ids legitimately come from elsewhere.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from pipelines.logs.tools import effect_of, id_arguments
from pipelines.toolcall.grammar import GroundingTooLarge, conversation_values, ground_ids

LOG = logging.getLogger("flywheel.grounding")

_EFFECTS_TTL_S = 60.0
_effects_cache: dict[str, tuple[float, dict[str, str]]] = {}
_effects_lock = threading.Lock()


class UnknownEffects(dict):
    """The catalogue's effects while the registered toolsets cannot be read: a tool that is not in it may be an
    imported write, so whoever judges writes treats it as one (`effect_of` already does: undeclared is a write)."""


_RETRY_S = 10.0  # an unreadable registry is tried again after this long, not on every request


def registered_effects(raw_zone: str) -> dict[str, str]:
    """`logs.toolsets.tool_effects` read at most once a minute per raw zone (a server calls this per request;
    on the cluster each read is an object-storage GET). A toolset imported since is picked up within a minute.
    When the read fails, the last good answer is kept (and the read retried after `_RETRY_S`); with none, an
    `UnknownEffects` of the catalogue's own, so an imported write is never taken for a read."""
    from pipelines.logs.toolsets import tool_effects

    now = time.monotonic()
    with _effects_lock:
        hit = _effects_cache.get(raw_zone)
        if hit and now - hit[0] < _EFFECTS_TTL_S:
            return hit[1]
    try:
        effects = tool_effects(raw_zone)
    except Exception as exc:  # noqa: BLE001 (storage unreachable: the last good answer, else the catalogue's)
        from pipelines.logs.tools import catalogue_effects

        LOG.warning(
            "toolset effects unreadable (%s: %s); using %s",
            type(exc).__name__,
            str(exc)[:200],
            "the last good read" if hit else "the catalogue's (other tools count as writes)",
        )
        kept = hit[1] if hit else UnknownEffects(catalogue_effects())
        with _effects_lock:
            _effects_cache[raw_zone] = (now - _EFFECTS_TTL_S + _RETRY_S, kept)
        return kept
    with _effects_lock:
        _effects_cache[raw_zone] = (now, effects)
    return effects


def judged_effects(offered: Iterable[str], registered: Mapping[str, str]) -> dict[str, str]:
    """The effects live traffic is judged with: the registered ones, and a tool the caller offered that the
    platform never registered counts as a read (or every disagreement on it would end a shadow or canary),
    except while the registry is unreadable (`UnknownEffects`): then it may be an imported write, and counts
    as one."""
    unknown = "write" if isinstance(registered, UnknownEffects) else "read"
    return {**dict.fromkeys(offered, unknown), **registered}


def stated_texts(turns: Iterable[dict[str, Any]]) -> list[str]:
    """What the conversation states: its user turns and tool results (chat turns carry tool results as user
    turns; raw messages as `tool` messages). Never the system prompt or the assistant's own calls."""
    return [str(t.get("content") or "") for t in turns if t.get("role") in ("user", "tool")]


def _writes(tools: str, effects: Mapping[str, str]) -> dict[str, list[str]]:
    parsed = json.loads(tools)
    specs = parsed["tools"] if isinstance(parsed, dict) else parsed
    out = {}
    for spec in specs if isinstance(specs, list) else []:
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        name = fn.get("name")
        if isinstance(name, str) and effect_of(name, effects) == "write":
            out[name] = id_arguments(spec)
    return out


def ground(tools: str, turns: Iterable[dict[str, Any]], effects: Mapping[str, str]) -> str:
    """The offered tools (a tools JSON, or `{"tools": ..., "abstain": false}`) with every write tool's id
    arguments limited to the values `turns` state (`grammar.ground_ids`)."""
    writes = _writes(tools, effects)
    if not writes:
        return tools
    try:
        return ground_ids(tools, writes, conversation_values(stated_texts(turns)))
    except GroundingTooLarge as exc:  # a very long conversation: decoded under the plain grammar, said so
        LOG.warning("ids not grounded for this turn: %s", exc)
        return tools
