"""What a served model is sent for one request: its chat turns and the offered tools it is decoded under.

It builds each request's chat turns exactly as the training set did (`pipelines.toolcall.prompt.
system_for` + `chat_turns`), taking the customer context from Feast's online store, so the prompt a
model sees in production is the prompt it was trained on (tested). The transport is `serve.client`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pipelines.config import Settings
from pipelines.toolcall.prompt import chat_turns, system_for

if TYPE_CHECKING:
    from pipelines.serve.client import TritonClient


def conversation(row: dict[str, Any], style: str, settings: Settings | None = None) -> list[dict[str, str]]:
    """The chat turns for one request in our row format (tools_json, messages_json, event_time, customer_id).
    Without a `context` in the row, the customer's context comes from the online feature store."""
    if "context" not in row and settings is not None and row.get("customer_id"):
        from pipelines.features.pipeline import online_context

        row = {**row, "context": online_context(row["customer_id"], settings)}
    return chat_turns(system_for(row, style), row["messages_json"])  # type: ignore[arg-type]


def offered_tools(
    settings: Settings, rows: list[dict[str, Any]], client: TritonClient | None = None, model: str | None = None
) -> list[str] | None:
    """The rows' offered tools for constrained decoding when serving is constrained (`triton.constrained`)
    and the model takes them (a folder built before the TOOLS input existed and kept while in use does
    not: it is decoded as it was built, and deploy rebuilds it once it is no longer in use)."""
    if not settings.triton.constrained:
        return None
    if client is not None and model is not None and not client.accepts_tools(model):
        return None
    if not settings.triton.grounded_ids:
        return [r["tools_json"] for r in rows]
    from pipelines.toolcall.grounding import ground, registered_effects

    effects = registered_effects(settings.zone("raw"))
    return [ground(r["tools_json"], json.loads(r["messages_json"]), effects) for r in rows]
