"""A model's growing tool-call text as OpenAI `chat.completion.chunk`s, while it is generated (pure).

The served model writes one compact call, `{"name":"<tool>","arguments":{...}}`, or `{"name":null}`
when no tool fits (the grammar admits nothing else; an unconstrained model may write anything). A
streaming caller gets the role as soon as the first token exists, the call's id and name as soon as
the name is complete, then the arguments as they grow. What is not yet certain is held back: the last
character of the text (it may close the call, not the arguments), and anything that is not a call of
an offered tool (no-tool answers and free text come whole at the end, as `chunks` makes them).
`finish` closes the stream from the finished completion body, which it makes consistent with what
was streamed (the same call id, the arguments the caller assembled), so the captured turn is what the
caller saw.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from pipelines.gateway import openai_api as api
from pipelines.gateway.openai_api import CALL_PREFIX, call_id, chunks

LOG = logging.getLogger("flywheel.gateway")


def _held(arguments: str) -> str:
    """The arguments that may go out now: up to a `<` that may start a redaction token (`toolcall.pii`); the
    rest goes out with the finished body, redaction tokens filled in."""
    at = arguments.find("<")
    return arguments if at < 0 else arguments[:at]


class ToolCallStream:
    def __init__(self, response_id: str, created: int, model: str, names: set[str], whole: set[str] | None = None):
        self.base = api.chunk_base(response_id, created, model, None)
        self.names = names
        # tools whose call goes out whole at the end: the grammar enforces them in part (`grammar.enforceable`), so
        # the gateway checks the finished call against the whole schema before anything of it is sent
        self.whole = whole or set()
        self.role_sent = False
        self.call: dict[str, Any] | None = None  # {"id", "name", "at"}: the streamed call, once its name is known
        self.args_sent = ""

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return api.chunk_of(self.base, delta, finish)

    def _role(self) -> list[dict[str, Any]]:
        if self.role_sent:
            return []
        self.role_sent = True
        return [self._chunk({"role": "assistant", "content": None})]

    def grow(self, text: str, fingerprint: str | None = None) -> list[dict[str, Any]]:
        """The chunks that the text so far adds to what was sent (text that does not extend the streamed
        call, as a fallback model's answer would not, adds nothing: `finish` settles it)."""
        if not text:
            return []
        self.base["system_fingerprint"] = self.base["system_fingerprint"] or fingerprint
        out = self._role()
        if self.call is None:
            found = CALL_PREFIX.match(text)
            if found is None:
                return out
            try:
                name = json.loads(f'"{found.group(1)}"')
            except json.JSONDecodeError:
                return out
            if name not in self.names or name in self.whole:
                return out
            self.call = {"id": call_id(self.base["id"]), "name": name, "at": found.end(), "prefix": text[: found.end()]}
            out.append(
                self._chunk(
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": self.call["id"],
                                "type": "function",
                                "function": {"name": name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
        if not text.startswith(self.call["prefix"]):
            return out
        arguments = _held(text[self.call["at"] : -1])  # the last character may close the call
        if arguments.startswith(self.args_sent) and len(arguments) > len(self.args_sent):
            out.append(
                self._chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[len(self.args_sent) :]}}]})
            )
            self.args_sent = arguments
        return out

    def finish(self, body: dict[str, Any], text: str | None, include_usage: bool) -> list[dict[str, Any]]:
        """The closing chunks from the finished completion `body` (answered from the model's whole `text`,
        or by another model, as a teacher or a fallback is). A body made by `openai_api.answer` from the
        streamed text already carries the streamed call's id and arguments (what is captured is what the
        caller assembled)."""
        self.base["system_fingerprint"] = self.base["system_fingerprint"] or body.get("system_fingerprint")
        choice = body["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        if self.call is None:  # nothing of a call went out: the whole answer now, after the role
            rest = chunks(
                {**body, **{k: self.base[k] for k in ("id", "created", "model", "system_fingerprint")}}, include_usage
            )
            return self._role() + (rest[1:] if self.role_sent else rest)
        out: list[dict[str, Any]] = []
        whole = calls[0]["function"]["arguments"] if calls and calls[0]["id"] == self.call["id"] else None
        if whole is not None and whole.startswith(self.args_sent):
            finish = choice["finish_reason"]  # the body's arguments: as streamed, redaction tokens filled in
        else:  # the model stopped inside the call (its token limit), its call was not passed on (a redaction token
            # nothing in the conversation fills), or another model answered otherwise: the caller keeps the
            # call it got, marked cut, and never a redaction token
            whole = _held(text[self.call["at"] :]) if text and text.startswith(self.call["prefix"]) else ""
            finish = "length"
        if whole and whole.startswith(self.args_sent) and len(whole) > len(self.args_sent):
            out.append(
                self._chunk({"tool_calls": [{"index": 0, "function": {"arguments": whole[len(self.args_sent) :]}}]})
            )
            self.args_sent = whole
        refusal = choice["message"].get("content") if not calls and choice["finish_reason"] == "stop" else None
        if (
            refusal
        ):  # the call was not passed on (a redaction token nothing fills): the caller gets the reason, not a call
            out.append(self._chunk({"content": refusal}))
            finish = "stop"
        out.append(self._chunk({}, finish))
        if include_usage:
            out.append({**self.base, "choices": [], "usage": body["usage"]})
        return out


class _Worker:
    """The request in a worker thread (`traffic.handle`): its growing text and its end come to the event loop as
    events through a queue, and every wait on it is bounded by its budget."""

    def __init__(self, traffic: Any, parsed: api.ChatCompletionRequest, served: api.Served, on_done: Any) -> None:
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.last_text: str | None = None
        self.task = asyncio.create_task(self._run(traffic, parsed, served, on_done))
        # every wait has a timeout: the model's own request budget, and a margin for the queue and the capture
        gateway_settings = getattr(getattr(traffic, "settings", None), "gateway", None)
        self.budget = float(getattr(gateway_settings, "request_timeout_s", 120.0)) + 30.0

    def _on_text(self, text: str) -> None:
        self.last_text = text
        self.loop.call_soon_threadsafe(self.events.put_nowait, ("text", text))

    async def _run(self, traffic: Any, parsed: api.ChatCompletionRequest, served: api.Served, on_done: Any) -> None:
        from starlette.concurrency import run_in_threadpool

        try:
            body = await run_in_threadpool(traffic.handle, parsed, self._on_text, served)
        except Exception as exc:  # noqa: BLE001 (handed to the response below)
            self.events.put_nowait(("error", exc))
        else:
            self.events.put_nowait(("done", body))
        finally:
            if on_done is not None:  # the generation is over (whether or not the caller is still there)
                on_done()

    async def next_event(self) -> tuple[str, Any]:
        """The next ("text" | "done" | "error", value); a 504 error when none comes within the budget."""
        try:
            return await asyncio.wait_for(self.events.get(), timeout=self.budget)
        except TimeoutError:
            return "error", api.ApiError(
                504, f"the model did not answer within {self.budget:.0f} s", kind="server_error", code="timeout"
            )

    async def finished(self) -> None:
        """Wait for the worker to end: the answer is captured even when the caller left early; the worker's own
        budget bounds it."""
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=self.budget)
        except TimeoutError:
            LOG.error("a streamed request's worker outlived its %.0f s budget", self.budget)


def _assembler(parsed: api.ChatCompletionRequest, served: api.Served) -> ToolCallStream:
    """The stream's call assembler for the offered tools (a partly constrained tool's call goes out whole)."""
    from pipelines.toolcall.grammar import GrammarError, partly_constrained

    specs = api.offered(parsed)
    try:
        partial = set(partly_constrained(specs))
    except GrammarError:
        partial = set()
    return ToolCallStream(
        served.response_id, served.created, parsed.model, {s["function"]["name"] for s in specs}, partial
    )


async def _frames(
    worker: _Worker, assembler: ToolCallStream, include_usage: bool, kind: str, value: Any
) -> AsyncIterator[bytes]:
    """The server-sent events from the first event (`kind`, `value`) on, until the answer or an error ends them."""
    try:
        while True:
            if kind == "text":
                for chunk in assembler.grow(value):
                    yield api.sse(chunk)
            elif kind == "done":
                for chunk in assembler.finish(value, worker.last_text, include_usage):
                    yield api.sse(chunk)
                yield api.sse("[DONE]")
                return
            else:
                failure = (
                    value
                    if isinstance(value, api.ApiError)
                    else api.ApiError(500, f"the gateway failed: {type(value).__name__}", kind="server_error")
                )
                if not isinstance(value, api.ApiError):
                    LOG.error("streamed request failed", exc_info=value)
                yield api.sse(failure.body())
                return
            kind, value = await worker.next_event()
    finally:
        await worker.finished()


async def stream_response(traffic: Any, parsed: api.ChatCompletionRequest, on_done: Any = None) -> Any:
    """The gateway's answer to `stream: true`: server-sent events as the model generates. The request runs
    in a worker thread (`traffic.handle`) whose growing text comes here through a queue. Until the first
    text, an error is an ordinary error response; after it, an error event ends the stream."""
    from fastapi.responses import StreamingResponse

    try:
        served = api.request_row(parsed)  # its response id is the stream's, and the captured turn's
    except BaseException:
        if on_done is not None:  # no worker will run: the caller's slot is given back here
            on_done()
        raise
    worker = _Worker(traffic, parsed, served, on_done)
    kind, value = await worker.next_event()
    if kind == "error":
        raise value
    include_usage = bool((parsed.stream_options or {}).get("include_usage"))
    return StreamingResponse(
        _frames(worker, _assembler(parsed, served), include_usage, kind, value), media_type="text/event-stream"
    )
