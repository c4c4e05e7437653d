"""A stand-in for the teacher: the large model the agent used before, behind an OpenAI-compatible
`/v1/chat/completions` on loopback (a cloud API cannot exist here, so this is the one mock the gateway
tests use). It answers the call it is told for a user message (`answers`), else `fallback`, checks the
bearer key, and keeps every request body it got so a test can see what reached the third party."""

from __future__ import annotations

import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "teacher-70b"


class Teacher:
    """The stand-in for the teacher model's OpenAI-compatible endpoint. No test reaches the real teacher: a hosted
    large model behind a cloud API cannot run here. The gateway's real client for it runs against this server in
    tests/test_gateway.py::test_shadow_answers_with_the_teacher_and_the_live_gate_moves_the_route_to_canary."""

    def __init__(self, fallback: dict[str, Any], answers: dict[str, dict[str, Any]] | None = None) -> None:
        self.key = secrets.token_urlsafe(24)
        self.fallback, self.answers = fallback, dict(answers or {})
        self.received: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="teacher-stub", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def __enter__(self) -> Teacher:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def call_for(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = next(
            (m.get("content") or "" for m in reversed(body.get("messages") or []) if m.get("role") == "user"), ""
        )
        return self.answers.get(asked, self.fallback)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        teacher = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:  # quiet
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                if self.path != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                if self.headers.get("Authorization") != f"Bearer {teacher.key}":
                    return self._send(401, {"error": {"message": "Incorrect API key provided"}})
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                teacher.received.append(body)
                call = teacher.call_for(body)
                message = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": f"call_{secrets.token_hex(6)}",
                            "type": "function",
                            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                        }
                    ],
                }
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{secrets.token_hex(8)}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": MODEL,
                        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                        "usage": {"prompt_tokens": 120, "completion_tokens": 12, "total_tokens": 132},
                    },
                )

        return Handler
