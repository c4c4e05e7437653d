"""Errors in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`), low in the layers so that
every part of the gateway's path (admission, the front door) refuses a request the same way."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An OpenAI-style error: HTTP status, message, type, param and code."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def rate_limited(message: str, retry_after: int = 1, code: str = "rate_limit_exceeded") -> ApiError:
    """An OpenAI-style 429 with `Retry-After` (seconds): every limit the gateway enforces answers with one."""
    return ApiError(429, message, kind="rate_limit_error", code=code, headers={"Retry-After": str(retry_after)})


def too_busy(limit: int) -> ApiError:
    return rate_limited(
        f"the gateway is answering {limit} requests, its limit (gateway.max_concurrent_requests); retry after a second"
    )


def too_large(size: int, limit: int) -> ApiError:
    return ApiError(
        413, f"request body is {size} bytes; this gateway accepts at most {limit}", code="request_too_large"
    )
