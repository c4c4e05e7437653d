"""The gateway's OpenAI shape without servers: a request renders the training prompt, answers become
tool calls or content, bad requests become OpenAI-style errors, and captured turns are log records
prep accepts (with the label the caller got). Streamed answers: test_gateway_stream.py; routes and the live
gate: test_gateway_routing.py; the servers themselves: test_gateway.py."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from gateway_records import DEFAULTS, chat_request, generated_records

from pipelines.gateway import capture
from pipelines.gateway import openai_api as api
from pipelines.gateway.capture import CaptureWriter
from pipelines.gateway.endpoints import read_body
from pipelines.logs.schema import check_line
from pipelines.prep.nodes import prepare_line
from pipelines.toolcall.calls import call_text
from pipelines.toolcall.prompt import chat_turns, system_for


def test_a_served_request_renders_exactly_the_prompt_training_saw() -> None:
    checked = 0
    for record in generated_records():
        row = prepare_line(orjson.dumps(record))
        if any(row[k] for k in row if k.startswith("redacted_")):
            continue  # PII: training sees it redacted, the gateway serves the caller's own text
        served = api.request_row(chat_request(record), now=datetime.fromisoformat(row["event_time"]))
        for style in ("names", "short", "full"):
            assert chat_turns(system_for(served.row, style), served.row["messages_json"]) == chat_turns(
                system_for(row, style), row["messages_json"]
            ), (record["record_id"], style)
        checked += 1
    assert checked > 100


def test_answers_become_tool_calls_or_content() -> None:
    specs = [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]
    call = api.answer('{"name":"get_order","arguments":{"order_id":"ord_1"}}', specs)
    assert call["finish_reason"] == "tool_calls" and call["message"]["content"] is None
    function = call["message"]["tool_calls"][0]["function"]
    assert function["name"] == "get_order" and json.loads(function["arguments"]) == {"order_id": "ord_1"}
    assert api.answer('{"name":null}', specs) == {
        "message": {"role": "assistant", "content": ""},
        "finish_reason": "stop",
    }
    unoffered = api.answer('{"name":"refund","arguments":{}}', specs)  # never a call to a tool not offered
    assert (
        unoffered["finish_reason"] == "stop" and unoffered["message"]["content"] == '{"name":"refund","arguments":{}}'
    )
    assert api.answer("sure, let me check", specs)["message"]["content"] == "sure, let me check"


@pytest.mark.parametrize(
    "body, status, where",
    [
        (b"{not json", 400, "parse the JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (json.dumps({"model": "champion", "messages": []}).encode(), 400, "'messages'"),
        (
            json.dumps(
                {
                    "model": "champion",
                    "messages": [{"role": "assistant", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "a"}}],
                }
            ).encode(),
            400,
            "user message",
        ),
        (json.dumps({"model": "champion", "messages": [{"role": "user", "content": "hi"}]}).encode(), 400, "tools"),
        (
            json.dumps(
                {
                    "model": "champion",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "a"}}],
                    "tool_choice": {"type": "function", "function": {"name": "b"}},
                }
            ).encode(),
            400,
            "tool_choice",
        ),
        (
            json.dumps({"model": "champion", "messages": [{"role": "user", "content": "x" * 9000}]}).encode(),
            413,
            "at most",
        ),
        (b"[" * 2000 + b"]" * 2000, 400, "nested too deeply"),  # was a 500 and a traceback
        # a string where the named choice's object belongs: was a 500 (`'str' object has no attribute 'get'`)
        (
            json.dumps(
                {
                    "model": "champion",
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [{"type": "function", "function": {"name": "refund"}}],
                    "tool_choice": {"type": "function", "function": "refund"},
                }
            ).encode(),
            400,
            "tool_choice",
        ),
        (b'{"model": "champion", "n": ' + b"9" * 4400 + b"}", 400, "parse the JSON"),  # past int's digit limit: 500
        # a lone surrogate (a cut emoji) cannot be encoded for the model: was a 503 that flushed the routes
        (
            b'{"model": "champion", "messages": [{"role": "user", "content": "hi \\ud83d"}], '
            b'"tools": [{"type": "function", "function": {"name": "a"}}]}',
            400,
            "lone surrogate",
        ),
    ],
)
def test_bad_requests_are_openai_style_errors(body: bytes, status: int, where: str) -> None:
    with pytest.raises(api.ApiError) as caught:
        api.parse_request(asyncio.run(read_body(_http_request(body, declared=True)[0], 8192)))
    assert caught.value.status == status and where in caught.value.message
    error = caught.value.body()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def _http_request(body: bytes, declared: bool, part: int = 1000) -> Any:
    """A Starlette request whose body arrives in parts, with or without a Content-Length."""
    from starlette.requests import Request

    parts = [body[i : i + part] for i in range(0, len(body), part)] or [b""]
    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if len(sent) == len(parts):
            return {"type": "http.disconnect"}
        sent.append(parts[len(sent)])
        return {"type": "http.request", "body": sent[-1], "more_body": len(sent) < len(parts)}

    headers = [(b"content-length", str(len(body)).encode())] if declared else [(b"transfer-encoding", b"chunked")]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive), sent


def test_an_oversize_body_is_refused_from_its_length_or_while_it_is_read_never_read_whole() -> None:
    body = json.dumps({"model": "champion", "messages": [{"role": "user", "content": "x" * 50_000}]}).encode()
    declared, sent = _http_request(body, declared=True)
    with pytest.raises(api.ApiError) as caught:
        asyncio.run(read_body(declared, 4096))
    assert caught.value.status == 413 and not sent  # refused from its Content-Length: nothing read
    chunked, sent = _http_request(body, declared=False)
    with pytest.raises(api.ApiError) as caught:
        asyncio.run(read_body(chunked, 4096))
    assert caught.value.status == 413 and len(sent) <= 5  # stopped at the limit, not after 51 parts
    small, _ = _http_request(b'{"a": 1}', declared=False)
    assert asyncio.run(read_body(small, 4096)) == b'{"a": 1}'


def test_a_captured_turn_is_a_log_record_prep_trains_on_with_the_label_served() -> None:
    for record in generated_records(40)[:20]:
        request = chat_request(record, metadata={"session_id": "s-1", "channel": "web"})
        served = api.request_row(request)
        name = served.specs[-1]["function"]["name"]
        body = api.completion(
            served,
            "champion",
            api.answer(json.dumps({"name": name, "arguments": {}}), served.specs),
            50,
            5,
            "tool_router_v1",
        )
        captured = capture.capture_record(request, served, body, latency_ms=12.5, defaults=DEFAULTS)
        verdict = check_line(orjson.dumps(captured))
        assert verdict.ok or verdict.reason.value == "invalid_arguments", verdict  # {} may lack required args
        assert captured["session_id"] == "s-1" and captured["channel"] == "web" and captured["country"] == "US"
        assert captured["customer_id"] == record["customer_id"] and captured["model"] == "champion"
        if verdict.ok:
            row = prepare_line(orjson.dumps(captured))
            assert json.loads(call_text(row["target_json"])) == {"name": name, "arguments": {}}
    abstained = capture.capture_record(
        request,
        served,
        api.completion(served, "champion", api.answer('{"name":null}', served.specs), 50, 3, None),
        latency_ms=1,
        defaults=DEFAULTS,
    )
    row = prepare_line(orjson.dumps(abstained))
    assert row["status"] == "clean" and json.loads(call_text(row["target_json"])) == {"name": None}


def test_concurrent_captures_are_whole_lines_rotated_and_partitioned_by_day(tmp_path: Path) -> None:
    writer = CaptureWriter(str(tmp_path / "raw"), rotate_bytes=4096)
    records = [
        {"record_id": f"r{i}", "timestamp": f"2026-11-2{i % 2}T10:00:00+00:00", "pad": "x" * 200} for i in range(200)
    ]

    def write(chunk: list[dict]) -> None:
        for r in chunk:
            writer.write(r)

    threads = [threading.Thread(target=write, args=(records[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    writer.close()
    files = sorted((tmp_path / "raw").glob("dt=*/gateway-*.jsonl"))
    assert len(files) > 2 and all(f.stat().st_size <= 4096 for f in files)
    seen = [orjson.loads(line) for f in files for line in f.read_bytes().splitlines()]
    assert sorted(r["record_id"] for r in seen) == sorted(r["record_id"] for r in records)
    for f in files:  # every record sits in its own day's partition
        assert {orjson.loads(line)["timestamp"][:10] for line in f.read_bytes().splitlines()} == {f.parent.name[3:]}


def test_the_latest_rating_of_a_record_replaces_its_feedback_in_prep(tmp_path: Path) -> None:
    from pipelines.logs.feedback import feedback_zone, read_feedback

    raw = str(tmp_path / "raw")
    ratings = CaptureWriter(feedback_zone(raw), 1 << 20)
    record = generated_records(3)[0]
    for at, rating in (
        ("2026-11-21T10:00:00+00:00", "down"),
        ("2026-11-22T09:00:00+00:00", "up"),
        ("2026-11-21T11:00:00+00:00", "down"),
    ):  # written out of order: the latest time wins
        ratings.write({"record_id": record["record_id"], "rating": rating, "timestamp": at})
    ratings.write({"record_id": "other", "rating": "meh", "timestamp": "2026-11-22T09:00:00+00:00"})  # not a rating
    ratings.close()
    with open(next(Path(feedback_zone(raw)).glob("dt=2026-11-22/*.jsonl")), "ab") as torn:
        torn.write(b'{"record_id": "x", "rat')  # a killed gateway's last line
    assert read_feedback(raw) == {record["record_id"]: "up"}
    assert prepare_line(orjson.dumps(record), feedback=read_feedback(raw))["feedback"] == "up"
    assert prepare_line(orjson.dumps(record))["feedback"] == record["feedback"]


def test_malformed_call_arguments_more_than_one_answer_and_short_keys_are_refused(tmp_path: Path) -> None:
    from pipelines.config import ConfigError, load_settings
    from pipelines.gateway.app import api_key

    history = [
        {"role": "user", "content": "track it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "track", "arguments": "{not json"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "{}"},
    ]
    tools = [{"type": "function", "function": {"name": "track"}}]
    for body in (
        {"model": "champion", "messages": history, "tools": tools},
        {"model": "champion", "messages": history[:1], "tools": tools, "n": 2},
    ):
        with pytest.raises(api.ApiError) as caught:
            api.parse_request(json.dumps(body).encode())
        assert caught.value.status == 400
    for key in ("", "short"):
        with pytest.raises(ConfigError, match="at least"):
            api_key(load_settings(root=str(tmp_path), gateway={"api_key": key}))


def test_a_cut_or_free_text_answer_is_never_a_training_label() -> None:
    specs = [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]
    served = api.request_row(
        api.parse_request(
            json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": specs}).encode()
        )
    )
    cut = api.answer('{"name":"get_order","arguments":{"order_id":"OR', specs, cut=True)
    assert cut["finish_reason"] == "length"
    for choice, label in (
        (cut, False),
        (api.answer("hello", specs), False),
        (api.answer('{"name":null}', specs), True),
        (api.answer('{"name":"get_order","arguments":{}}', specs), True),
    ):
        assert api.is_label(api.completion(served, "m", choice, 1, 1, None)) is label


def test_past_its_concurrency_limit_the_gateway_answers_429_at_once_and_its_probes_still_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twice the limit at once: exactly `max_concurrent_requests` are answered, every other one gets a 429 with
    Retry-After at once (none queued, none lost); a streamed request that fails before its worker starts gives
    its slot back."""
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from pipelines.config import load_settings
    from pipelines.gateway.app import api_key, create_app
    from pipelines.gateway.traffic import Traffic

    release, entered = threading.Event(), threading.Semaphore(0)

    def handle(self, parsed, *args, **kwargs):  # the model's work, held until every request has arrived
        """A stand-in for `Traffic.handle` (the route to Triton and its answer). The real one on a real Triton
        server runs in tests/test_gateway.py::test_the_openai_client_gets_tool_calls_sync_and_streamed."""
        entered.release()
        assert release.wait(30)
        return {"id": "chatcmpl-x", "choices": []}

    monkeypatch.setattr(Traffic, "handle", handle)
    settings = load_settings(root=str(tmp_path), gateway={"max_concurrent_requests": 3})
    body = {
        "model": "champion",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}],
    }
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        headers = {"Authorization": f"Bearer {api_key(settings)}"}
        with ThreadPoolExecutor(6) as pool:
            admitted = [pool.submit(client.post, "/v1/chat/completions", json=body, headers=headers) for _ in range(3)]
            for _ in range(3):
                assert entered.acquire(timeout=30)  # the three slots are taken
            refused = [client.post("/v1/chat/completions", json=body, headers=headers) for _ in range(3)]
            release.set()
            answered = [f.result(timeout=30) for f in admitted]
        assert [r.status_code for r in answered] == [200, 200, 200]
        assert [r.status_code for r in refused] == [429, 429, 429]
        assert all(
            r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "rate_limit_exceeded" for r in refused
        )
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200  # slots freed

        # a streamed request that fails before its generation starts: a 500, and its slot is released
        def broken(*_args, **_kwargs):
            raise ValueError("no row")

        monkeypatch.setattr(api, "request_row", broken)
        for _ in range(4):  # more failures than slots: a leak would turn the next request into a 429
            assert (
                client.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers).status_code == 500
            )
        monkeypatch.undo()
        monkeypatch.setattr(Traffic, "handle", handle)
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200


def test_what_the_gateway_keeps_at_rest_is_redacted_and_expires(tmp_path: Path) -> None:
    """Unusable answers and live comparisons live outside the raw zone (no prep redacts them): they are
    written redacted, and their day partitions older than gateway.retention_days are deleted at start."""
    from pipelines.gateway.capture import expire
    from pipelines.gateway.traffic import _redacted

    kept = _redacted(
        {
            "messages": [{"role": "user", "content": "bill ana.lima@example.com, card 4111 1111 1111 1111"}],
            "arguments": '{"recipient_email":"ana.lima@example.com"}',
        }
    )
    assert "ana.lima@example.com" not in json.dumps(kept) and "4111 1111" not in json.dumps(kept)
    assert "<EMAIL>" in kept["messages"][0]["content"] and "<CARD>" in kept["messages"][0]["content"]
    zone = tmp_path / "unusable"
    for day in ("2026-10-01", "2026-11-20", "2026-11-25"):
        (zone / f"dt={day}").mkdir(parents=True)
        (zone / f"dt={day}" / "a.jsonl").write_text("{}\n")
    gone = expire(str(zone), 30, today="2026-11-26")
    assert [Path(g).name for g in gone] == ["dt=2026-10-01"]
    assert sorted(p.name for p in zone.iterdir()) == ["dt=2026-11-20", "dt=2026-11-25"]
