"""The commerce-agent log record: one agent turn in the OpenAI chat-completions shape.

`request` is what the agent sent to the model (messages + tools), `response` what came back
(an assistant message with `tool_calls`, or plain content when no tool fits). The JSON Schema file
next to this module (`agent_turn.schema.json`) is generated from `AgentTurn` by
`flywheel logs schema --write` and checked against it in the tests, so the two never drift.

`check_line` is the single place that decides whether a raw line is usable and, if not, why: the
generator's tests, Spark prep and the quality gates all call it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from pipelines.logs.tools import TOOLS_BY_NAME, WORKLOADS, argument_errors

SCHEMA_FILE = Path(__file__).with_name("agent_turn.schema.json")

Workload = Literal[WORKLOADS]  # type: ignore[valid-type]
Channel = Literal["web", "mobile_app", "chat_widget", "voice", "api"]
Feedback = Literal["up", "down", "none"]
# who wrote a record's answer (its label): the teacher (the large model the agent used, or `gateway.teacher_url`),
# our champion (its own answer, served), a person (a review's correction), an import of public data, or our
# generator, or our own model's answers in an episode the environment judged successful (`verified`: rejection
# sampling). Prep trains on the sources `quality.train_label_sources` names; the champion's own answers only
# when a person confirmed them (rated up); a down-rated answer never trains and waits for review.
LabelSource = Literal["teacher", "champion", "human", "import", "generated", "verified"]
LABEL_SOURCES: tuple[str, ...] = ("teacher", "champion", "human", "import", "generated", "verified")

# Plausibility bounds: values outside them are "impossible", not merely unusual.
MAX_LATENCY_MS = 120_000.0
MAX_TOKENS = 131_072
# a canary's teacher copy (the teacher's answer to a request the candidate served) is captured as a record of its
# own, `<response id>` + this suffix, in the served turn's session: the chosen side of a canary pair
TEACHER_COPY_SUFFIX = "-teacher"
ANONYMOUS = "anonymous"  # the customer id the gateway logs for a caller that sent no `user` (served without context)


class _Open(BaseModel):
    # Agent frameworks add their own fields; we keep them rather than reject the record.
    model_config = ConfigDict(extra="allow")


class FunctionCall(_Open):
    name: str = Field(min_length=1)
    arguments: str = Field(description="JSON-encoded arguments, as in the OpenAI API")


class ToolCall(_Open):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionSpec(_Open):
    name: str = Field(min_length=1)
    description: str = ""
    parameters: dict[str, Any]


class ToolSpec(_Open):
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatRequest(_Open):
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolSpec] = Field(min_length=1)


class AssistantMessage(Message):
    role: Literal["assistant"] = "assistant"


class Choice(_Open):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["tool_calls", "stop", "length"] = "tool_calls"


class ChatResponse(_Open):
    id: str = Field(min_length=1)
    choices: list[Choice] = Field(min_length=1)


class AgentTurn(_Open):
    """One turn of the commerce agent's tool-calling step."""

    record_id: str = Field(min_length=1, description="Unique id of this log record")
    timestamp: datetime = Field(description="When the model answered (ISO 8601, UTC)")
    session_id: str = Field(min_length=1, description="Conversation the turn belongs to")
    turn_index: int = Field(ge=0, description="0-based position of the turn in its session")
    customer_id: str = Field(min_length=1, description="Shopper or merchant account")
    workload_id: Workload = Field(description="Agent node that handled the turn")
    model: str = Field(min_length=1, description="Model that produced the response")
    request: ChatRequest
    response: ChatResponse
    latency_ms: float = Field(description="End-to-end model latency of the turn")
    retrieval_latency_ms: float = Field(description="Time spent in retrieval before the model call")
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    country: str = Field(pattern=r"^[A-Z]{2}$", description="ISO 3166-1 alpha-2")
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217")
    channel: Channel
    feedback: Feedback = Field(description="Thumbs up/down from the user, or none")
    label_source: LabelSource | None = Field(
        default=None,
        description="Who wrote the answer (the label): teacher, "
        "champion, human, import, generated or verified; absent: inferred by prep",
    )


_ADAPTER = TypeAdapter(AgentTurn)


class Reason(StrEnum):
    """Why a raw line was quarantined (the quarantine table's `reason` column)."""

    BAD_JSON = "bad_json"
    SCHEMA_VIOLATION = "schema_violation"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    IMPOSSIBLE_VALUE = "impossible_value"


@dataclass(frozen=True, slots=True)
class Verdict:
    reason: Reason | None
    detail: str = ""
    record: dict[str, Any] | None = None
    timestamp: datetime | None = None  # parsed and timezone-aware; canonical form for downstream engines

    @property
    def ok(self) -> bool:
        return self.reason is None


def json_schema() -> dict[str, Any]:
    schema = AgentTurn.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://commerce-flywheel.dev/schemas/agent_turn.schema.json"
    return schema


def write_json_schema(path: Path = SCHEMA_FILE) -> Path:
    path.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def teacher_call(record: dict[str, Any]) -> dict[str, Any] | None:
    """The response's first tool call as {name, arguments(dict)}; None when the model abstained."""
    calls = record["response"]["choices"][0]["message"].get("tool_calls") or []
    if not calls:
        return None
    fn = calls[0]["function"]
    return {"name": fn["name"], "arguments": json.loads(fn["arguments"])}


def check_line(line: str | bytes, tools: Mapping[str, dict[str, Any]] | None = None) -> Verdict:
    """Classify one raw JSONL line: usable (reason None) or the first reason it is not.

    `tools` is the catalogue to check calls against (default: ours; see `tools.catalogue` for
    imported toolsets)."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return Verdict(Reason.BAD_JSON, str(exc)[:200])
    if not isinstance(raw, dict):
        return Verdict(Reason.BAD_JSON, f"expected a JSON object, got {type(raw).__name__}")
    try:
        turn = _ADAPTER.validate_python(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return Verdict(Reason.SCHEMA_VIOLATION, f"{where}: {err['msg']}"[:300])
    return _check_semantics(turn, raw, TOOLS_BY_NAME if tools is None else tools)


def _check_semantics(turn: AgentTurn, raw: dict[str, Any], tools: Mapping[str, dict[str, Any]]) -> Verdict:
    offered = {t.function.name for t in turn.request.tools}
    for call in turn.response.choices[0].message.tool_calls or []:
        name = call.function.name
        if name not in tools:
            return Verdict(Reason.UNKNOWN_TOOL, f"{name!r} is not in the tool catalogue")
        if name not in offered:
            return Verdict(Reason.UNKNOWN_TOOL, f"{name!r} was not offered in request.tools")
        try:
            arguments = orjson.loads(call.function.arguments)
        except orjson.JSONDecodeError:
            return Verdict(Reason.INVALID_ARGUMENTS, f"{name}: arguments are not valid JSON")
        errors = argument_errors(name, arguments, tools)
        if errors:
            return Verdict(Reason.INVALID_ARGUMENTS, f"{name}: {errors[0]}"[:300])
    if not 0 < turn.latency_ms <= MAX_LATENCY_MS:
        return Verdict(Reason.IMPOSSIBLE_VALUE, f"latency_ms={turn.latency_ms} outside (0, {MAX_LATENCY_MS:.0f}]")
    if not 0 <= turn.retrieval_latency_ms <= turn.latency_ms:
        return Verdict(
            Reason.IMPOSSIBLE_VALUE, f"retrieval_latency_ms={turn.retrieval_latency_ms} outside [0, latency_ms]"
        )
    if turn.prompt_tokens > MAX_TOKENS or turn.completion_tokens > MAX_TOKENS:
        return Verdict(Reason.IMPOSSIBLE_VALUE, "token counts above the context limit")
    ts = turn.timestamp if turn.timestamp.tzinfo else turn.timestamp.replace(tzinfo=UTC)
    return Verdict(None, record=raw, timestamp=ts.astimezone(UTC))
