"""The OpenAI chat-completions shape, as pure functions: the gateway's request validation, the row a
request becomes (built with the training set's own functions, so the served prompt is the trained
prompt), the answer a model's tool-call text becomes (a `tool_calls` message, or `content` when no
tool fits), its streamed chunks and OpenAI-style error bodies (the log record a served turn is captured as
is `capture.capture_record`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, field_validator

from pipelines.api_errors import ApiError, rate_limited, too_busy, too_large  # noqa: F401 (re-exported)
from pipelines.prep.nodes import conversation_of
from pipelines.toolcall.prompt import system_prompt, tools_json


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Function(_Open):
    name: str = Field(min_length=1)
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        try:
            parsed = json.loads(value or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments must be a JSON object ({exc})") from None
        if not isinstance(parsed, dict):
            raise ValueError("arguments must be a JSON object")
        return value or "{}"  # no arguments at all: an empty object (as the call's text has it)


class Call(_Open):
    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: Function


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[Call] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text(cls, value: Any) -> str | None:
        """Content parts (`[{"type": "text", "text": ...}]`) joined: only text reaches a tool router."""
        if isinstance(value, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
            ):
                raise ValueError("only text content parts are supported")
            return "".join(p["text"] for p in value)
        return value


class FunctionSpec(_Open):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolSpec(_Open):
    type: Literal["function"] = "function"
    function: FunctionSpec


NAMED_CHOICE = {  # the schema of a named tool_choice (kept a dict in code; `_named_tool` checks it)
    "type": "object",
    "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1}},
        },
    },
}


NamedChoice = Annotated[dict[str, Any], WithJsonSchema(NAMED_CHOICE)]


class ChatCompletionRequest(_Open):
    """OpenAI's chat-completions request, the fields a tool router reads (others are accepted and ignored)."""

    model: str = Field(min_length=1, description="the route: champion, candidate, previous, base or v<N>")
    messages: list[Message] = Field(min_length=1, description="the conversation; the last is the user's (or a tool's)")
    tools: list[ToolSpec] | None = Field(None, description="the tools the agent offers (OpenAI function specs)")
    tool_choice: (
        Literal["auto", "none", "required"] | Annotated[dict[str, Any], WithJsonSchema(NAMED_CHOICE)] | None
    ) = Field(None, description='auto, none, required, or {"type": "function", "function": {"name": ...}}')
    stream: bool = Field(False, description="answer as server-sent events (chat.completion.chunk)")
    stream_options: dict[str, Any] | None = Field(None, description='{"include_usage": true} adds a usage chunk')
    user: str | None = Field(None, description="the customer id: the online customer context joins on it")
    metadata: dict[str, str] | None = Field(
        None, description="session_id, workload_id, country, currency, channel of the captured turn"
    )
    n: int = Field(1, ge=1, le=1, description="one answer per request")

    @field_validator("tool_choice")
    @classmethod
    def _named_tool(cls, value: Any) -> Any:
        """A named choice is `{"type": "function", "function": {"name": "<tool>"}}`, as OpenAI's API has it."""
        if isinstance(value, dict):
            function = value.get("function")
            if (
                value.get("type") != "function"
                or not isinstance(function, dict)
                or not isinstance(function.get("name"), str)
                or not function["name"]
            ):
                raise ValueError(
                    'expected "auto", "none", "required" or {"type": "function", "function": {"name": ...}}'
                )
        return value


def model_error(model: str, message: str) -> ApiError:
    """A Triton error as the caller's error: the request's fault (too long, tools the grammar cannot
    express) is a 400; anything else (the server down, a timeout) a 503 to retry."""
    if "this model accepts at most" in message:
        return ApiError(400, f"{model}: {message}", param="messages", code="context_length_exceeded")
    if message.startswith(("tool ", "the offered tools", "an offered tool")):  # tool_grammar.GrammarError
        return ApiError(400, f"{model}: {message}", param="tools", code="unsupported_tool_schema")
    return ApiError(503, f"{model}: {message}", kind="server_error", code="model_unavailable")


_INT64 = range(-(2**63), 2**63)


def _int64(text: str) -> int:
    """A JSON integer, or a ValueError past the signed 64-bit range (what both orjson, which writes the capture,
    and llguidance, which compiles the grammar, hold)."""
    value = int(text)
    if value not in _INT64:
        raise ValueError(f"the integer {text[:30]}{'...' if len(text) > 30 else ''} is past the 64-bit range")
    return value


def _not_json(name: str) -> Any:
    """Python's decoder reads `NaN` and `Infinity`, which JSON has not (the capture's writer would store null)."""
    raise ValueError(f"{name} is not a JSON value")


def decode_body(body: bytes) -> Any:
    """A request body as JSON, or a 400 saying why not: not UTF-8, not JSON, nested past what any request needs
    (`[[[[...`), an integer past 64 bits (what the capture's JSON writer and the grammar compiler hold), `NaN` or
    `Infinity` (not JSON), or text that is not Unicode (a lone surrogate such as the first half of a cut emoji,
    which nothing downstream could encode). The one decoder of every body the gateway reads."""
    try:
        data = json.loads(body, parse_int=_int64, parse_constant=_not_json)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"We could not parse the JSON body of your request ({exc})") from None
    except RecursionError:
        raise ApiError(400, "We could not parse the JSON body of your request (nested too deeply)") from None
    except ValueError as exc:  # int() past sys.get_int_max_str_digits(), past 64 bits (`_int64`), NaN (`_not_json`)
        raise ApiError(400, f"We could not parse the JSON body of your request ({exc})") from None
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, "the request body holds text that is not valid Unicode (a lone surrogate, e.g. half an emoji)"
        ) from None
    except RecursionError:
        raise ApiError(400, "We could not parse the JSON body of your request (nested too deeply)") from None
    return data


def parse_request(body: bytes) -> ChatCompletionRequest:
    """The validated request (its size already checked where it was read: `endpoints.read_body`), or an ApiError
    naming what is wrong (as the OpenAI API words it)."""
    data = decode_body(body)
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        request = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"])
        raise ApiError(400, f"Invalid value for '{param}': {first['msg']}", param=param, code="invalid_value") from None
    if not any(m.role == "user" for m in request.messages):
        raise ApiError(400, "messages must contain at least one user message", param="messages")
    if request.messages[-1].role not in ("user", "tool"):
        raise ApiError(400, "the last message must be the user's request (or a tool result)", param="messages")
    if not request.tools and request.tool_choice != "none":
        raise ApiError(400, "this model routes tool calls: send the offered `tools`", param="tools")
    offered(request)  # a named tool_choice must name an offered tool
    return request


def offered(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The tools the model may call, as OpenAI tool specs; a named `tool_choice` narrows them to that one."""
    specs = [t.model_dump(exclude_none=True) for t in request.tools or []]
    choice = request.tool_choice
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        specs = [s for s in specs if s["function"]["name"] == name]
        if not specs:
            raise ApiError(400, f"tool_choice names {name!r}, which is not in `tools`", param="tool_choice")
    return specs


@dataclass(frozen=True)
class Served:
    """One request as a row in our training-set format, and the ids it is answered and captured with."""

    row: dict[str, Any]
    specs: list[dict[str, Any]]
    messages: list[dict[str, Any]]  # as sent, `developer` written as `system` (our log schema's roles)
    response_id: str
    created: int


def request_row(request: ChatCompletionRequest, now: datetime | None = None) -> Served:
    """The row the training set would hold for this request (tools_json, messages_json, event_time,
    customer_id, system_prompt), built with prep's own functions; `conversation()` then renders it
    exactly as training did. The text is not redacted: the answer must carry the caller's values."""
    now = now or datetime.now(UTC)
    specs = offered(request)
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    for m in messages:  # developer messages are the newer name for system messages
        m["role"] = "system" if m["role"] == "developer" else m["role"]
    offered_json = tools_json(specs) if specs else "[]"
    row = {
        "record_id": f"gateway-{uuid.uuid4().hex}",
        "customer_id": request.user or "",
        "event_time": now.isoformat(timespec="microseconds"),
        "tools_json": offered_json,
        "messages_json": json.dumps(conversation_of(messages), separators=(",", ":"), ensure_ascii=False),
        "system_prompt": system_prompt(offered_json, now.date().isoformat()),
    }
    return Served(row, specs, messages, f"chatcmpl-{uuid.uuid4().hex}", int(now.timestamp()))


CALL_PREFIX = re.compile(r'^\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')


def call_id(response_id: str) -> str:
    """The id of a response's tool call (one call per response: known before the call is generated)."""
    return f"call_{response_id[-24:]}"


def arguments_text(text: str | None) -> str | None:
    """The arguments object of a whole call `{"name":"x","arguments":{...}}` exactly as the model wrote
    it (what a streaming caller assembles), or None when the text is not such a call."""
    found = CALL_PREFIX.match(text or "")
    stripped = (text or "").rstrip()
    if found is None or not stripped.endswith("}"):
        return None
    candidate = stripped[found.end() : -1].rstrip()
    try:
        return candidate if isinstance(json.loads(candidate), dict) else None
    except json.JSONDecodeError:
        return None


def answer(
    text: str,
    specs: list[dict[str, Any]],
    cut: bool = False,
    response_id: str | None = None,
    stated: list[str] | None = None,
) -> dict[str, Any]:
    """A model's tool-call text as the assistant message the caller gets, with its finish reason:
    `{"name": <offered tool>, "arguments": {...}}` -> one tool call (the arguments as the model wrote
    them, the id from `response_id`); `{"name": null}` (no tool fits) -> empty content; anything else
    (an unconstrained model's free text) -> that text as content, with finish reason `length` when the
    model stopped at its token limit (`cut`). A redaction token in the arguments is replaced by the value
    the conversation (`stated`: the customer's own turns, `stated_texts`) gives for it, or the call is not passed on
    (`toolcall.pii`): a redaction token never reaches the caller."""
    names = {s["function"]["name"] for s in specs}
    try:
        call = json.loads(text)
    except json.JSONDecodeError:
        call = None
    if isinstance(call, dict) and call.get("name") in names and isinstance(call.get("arguments", {}), dict):
        arguments = arguments_text(text) or json.dumps(
            call.get("arguments", {}), separators=(",", ":"), ensure_ascii=False
        )
        from pipelines.toolcall.pii import pass_on

        arguments, passed = pass_on(arguments, stated or [])
        if not passed:  # a redaction token the conversation does not fill: the caller is asked for the value
            return {"message": {"role": "assistant", "content": arguments}, "finish_reason": "stop"}
        from pipelines.toolcall.calls import schema_breach

        # a tool the grammar enforces only in part (a keyword it lacks, e.g. uniqueItems): its whole schema is
        # checked after decoding, and a call that breaks it is never passed on
        spec = next(s for s in specs if s["function"]["name"] == call["name"])
        where = schema_breach(call["name"], json.loads(arguments), spec["function"].get("parameters"))
        if where:  # the argument's path only: the message would echo its value
            return {
                "message": {
                    "role": "assistant",
                    "content": f"error: the answer's {call['name']} call breaks its "
                    f"schema at {where}; no call was made",
                },
                "finish_reason": "stop",
            }
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id(response_id) if response_id else f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }
            ],
        }
        return {"message": message, "finish_reason": "tool_calls"}
    if isinstance(call, dict) and call.get("name") is None and set(call) <= {"name", "arguments"}:
        return {"message": {"role": "assistant", "content": ""}, "finish_reason": "stop"}
    return {"message": {"role": "assistant", "content": text}, "finish_reason": "length" if cut else "stop"}


def stated_texts(served: Served, roles: tuple[str, ...] = ("user",)) -> list[str]:
    """What the caller's conversation states in `roles` (default: the customer's own turns; a redaction token is
    filled from them only, never from a tool result that may name another person)."""
    return [m["content"] for m in served.messages if m.get("role") in roles and isinstance(m.get("content"), str)]


def is_label(body: dict[str, Any]) -> bool:
    """Whether a served answer may become a training label: a tool call, or an explicit "no tool fits"
    (empty content). A cut or free-text answer is a failure of the model, not a label."""
    choice = body["choices"][0]
    return bool(choice["message"].get("tool_calls")) or (
        choice["finish_reason"] == "stop" and not choice["message"].get("content")
    )


def completion(
    served: Served,
    model: str,
    choice: dict[str, Any],
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str | None,
) -> dict[str, Any]:
    return {
        "id": served.response_id,
        "object": "chat.completion",
        "created": served.created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [
            {"index": 0, "message": choice["message"], "logprobs": None, "finish_reason": choice["finish_reason"]}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def chunk_base(response_id: str, created: int, model: str, fingerprint: str | None) -> dict[str, Any]:
    """What every `chat.completion.chunk` of one response repeats."""
    return {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
    }


def chunk_of(base: dict[str, Any], delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """One streamed chunk (the one place chunks are built: finished answers and live streams alike)."""
    return {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


def chunks(body: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    """A finished completion as the `chat.completion.chunk` sequence a streaming caller reads: the role,
    the call's name and id, its arguments, then the finish reason (and the usage, when asked)."""
    base = chunk_base(body["id"], body["created"], body["model"], body["system_fingerprint"])
    choice = body["choices"][0]
    message = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return chunk_of(base, delta, finish)

    out = [chunk({"role": "assistant", "content": "" if not message.get("tool_calls") else None})]
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""},
                        }
                    ]
                }
            )
        )
        out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": call["function"]["arguments"]}}]}))
    if message.get("content"):
        out.append(chunk({"content": message["content"]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**base, "choices": [], "usage": body["usage"]})
    return out


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


def now_ms() -> float:
    return time.perf_counter() * 1000
