"""Shared by the gateway tests: the OpenAI-compatible gateway process on loopback in front of the real
Triton server serving registered tiny-model adapters (v1 champion, v2 candidate) and the base model, with a
teacher upstream configured (`teacher_stub`), and the helpers that read what it captured. The `gateway`
fixture is module-scoped: a module that imports it trains and serves once."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from ports import free_port
from serving_fixtures import registered  # noqa: F401 (the module-scoped fixture: v1 champion, v2 candidate)
from teacher_stub import Teacher

# bounded arguments (enums, ranges, short strings): every answer the grammar admits fits the token budget
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "track",
            "description": "Track a parcel",
            "parameters": {
                "type": "object",
                "required": ["carrier", "days"],
                "properties": {
                    "carrier": {"type": "string", "enum": ["ups", "dhl", "fedex"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 30},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund",
            "description": "Refund an order",
            "parameters": {
                "type": "object",
                "required": ["order"],
                "properties": {"order": {"type": "string", "pattern": "^ORD-[0-9]{4}$"}, "full": {"type": "boolean"}},
            },
        },
    },
]
PING = [{"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "system", "content": "You route requests."}, {"role": "user", "content": "where is my dhl parcel?"}]


TEACHER_CALL = {"name": "track", "arguments": {"carrier": "dhl", "days": 3}}  # what the teacher answers by default


@pytest.fixture(scope="module")
def gateway(registered):  # noqa: F811
    from pydantic import SecretStr

    from pipelines.gateway import app as gw
    from pipelines.serve import deploy, repository
    from pipelines.serve.client import TritonClient

    settings = registered["settings"]
    settings.triton.max_new_tokens = 40  # a whole bounded call (the shared fixture's 12 cut it short)
    settings.gateway.port = free_port()
    settings.gateway.gate_requests, settings.gateway.min_agreement = 6, 0.0  # the live gate moves after 6 comparisons
    deploy.deploy(settings, "champion")
    client = TritonClient(settings)
    try:
        for entry in (
            repository.build_version(settings, registered["v2"]),
            repository.build_base(settings, "tiny-llama"),
        ):
            client.load(entry.name)
    finally:
        client.close()
    with Teacher(TEACHER_CALL) as teacher:  # the large model the agent used: an OpenAI-compatible upstream
        settings.gateway.teacher_url, settings.gateway.teacher_api_key = teacher.url, SecretStr(teacher.key)
        gw.up(settings)
        yield {**registered, "url": gw.base_url(settings), "key": gw.api_key(settings), "teacher": teacher}
        gw.down(settings)


def _client(gateway, key: str | None = None):
    from openai import OpenAI

    return OpenAI(base_url=gateway["url"], api_key=key or gateway["key"], timeout=120, max_retries=0)


def _captured(settings, zone: str | None = None, *, killed: bool = False) -> dict[str, dict]:
    """The turns the gateway captured into the raw zone, or into `zone` (the unusable answers' folder). Every
    line is whole, but where the test `killed` the gateway: its files' last line may be torn."""
    folder = Path(zone or settings.zone("raw"))
    records = {}
    for f in sorted(folder.glob("dt=*/gateway-*.jsonl")):
        lines = f.read_bytes().splitlines()
        for n, line in enumerate(lines):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                if killed and n == len(lines) - 1:  # a killed gateway's last, unanswered write (prep quarantines it)
                    continue
                raise
            records[record["record_id"]] = record
    return records


def _unusable(settings, *, killed: bool = False) -> dict[str, dict]:
    """Answers that are no label (cut, free text): kept apart from the raw zone, never trained on."""
    return _captured(settings, f"{settings.zone('serving')}/gateway/unusable", killed=killed)


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
