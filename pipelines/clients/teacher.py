"""Thin client for the teacher: the large model the agent used before, behind an OpenAI-compatible endpoint
(`gateway.teacher_url`, `gateway.teacher_model`, `gateway.teacher_api_key`).

Two callers: the gateway (shadow: the teacher answers the caller; canary: it answers a copy) and the review
queue's relabelling (`flywheel labels relabel`: the teacher answers a down-rated turn again). Only what the
teacher needs is sent (the messages, the tools, the tool choice): never a customer id or metadata to a third
party. Every call has the timeout it is given; every failure is a `TeacherError` with one line naming the
endpoint without its credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.config import Settings


class TeacherError(RuntimeError):
    """The teacher did not answer with a chat completion (a retry may succeed): `status` is the HTTP status a
    gateway answers with (503 down or not configured, 502 a bad answer), `code` OpenAI's error code."""

    def __init__(
        self, message: str, status: int, code: str, upstream_status: int | None = None, reached: bool = True
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.upstream_status = status, code, upstream_status
        self.reached = reached  # False: no connection (down, not configured), whatever the request was


@dataclass(frozen=True)
class TeacherAnswer:
    message: dict[str, Any]  # the assistant message, with `finish_reason` set
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    model: str  # the model the teacher says answered


@dataclass(frozen=True)
class TeacherClient:
    url: str
    model: str
    api_key: str | None
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> TeacherClient:
        """The configured teacher; `TeacherError` (503) when `gateway.teacher_url` is not set."""
        g = settings.gateway
        if not g.teacher_url:
            raise TeacherError(
                "no teacher is configured (gateway.teacher_url)", 503, "teacher_unavailable", None, False
            )
        key = g.teacher_api_key.get_secret_value() if g.teacher_api_key else None
        return cls(g.teacher_url, g.teacher_model, key, g.request_timeout_s)

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tool_choice: Any = None
    ) -> TeacherAnswer:
        import httpx

        from pipelines.security import redact_uri

        payload = {
            "model": self.model,
            "messages": messages,
            "tools": tools,
            "stream": False,
            **({"tool_choice": tool_choice} if tool_choice is not None else {}),
        }
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        where = redact_uri(self.url)
        try:
            response = httpx.post(
                f"{self.url.rstrip('/')}/chat/completions", json=payload, headers=headers, timeout=self.timeout_s
            )
        except (httpx.HTTPError, UnicodeError, ValueError) as exc:  # down, or a request it could not be sent
            reached = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))  # e.g. a read timeout
            raise TeacherError(
                f"the teacher at {where} did not answer ({type(exc).__name__})",
                503,
                "teacher_unavailable",
                None,
                reached,
            ) from None
        if response.status_code != 200:
            raise TeacherError(
                f"the teacher at {where} answered HTTP {response.status_code}",
                502,
                "teacher_error",
                response.status_code,
            )
        try:
            upstream = response.json()
            usage = upstream.get("usage") or {}
            choice = upstream["choices"][0]
            message = choice["message"]
            message["role"]
            reason = choice.get("finish_reason") or ("tool_calls" if message.get("tool_calls") else "stop")
            return TeacherAnswer(
                message=message,
                finish_reason=str(reason),
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
                model=str(upstream.get("model") or self.model),
            )
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise TeacherError(f"the teacher at {where} sent no chat completion", 502, "teacher_error") from None
