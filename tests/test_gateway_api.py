"""The gateway's OpenAI shape without servers: a request renders the training prompt, answers become
tool calls or content, bad requests become OpenAI-style errors, and captured turns are log records
prep accepts (with the label the caller got). The servers themselves: test_gateway.py."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import date, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipelines.logs.generator import GeneratorConfig, TrafficGenerator
from pipelines.logs.schema import check_line
from pipelines.prep.nodes import prepare_line
from pipelines.toolcall.calls import call_text
from pipelines.toolcall.prompt import chat_turns
from pipelines.gateway import openai_api as api
from pipelines.gateway.app import read_body
from pipelines.gateway.capture import CaptureWriter
from pipelines.toolcall.prompt import system_for

DEFAULTS = {"country": "US", "currency": "USD", "channel": "api"}


def _records(n: int = 300) -> list[dict]:
    gen = TrafficGenerator(GeneratorConfig(seed=11, records=n, bad_share=0.0, end_date=date(2026, 11, 20)))
    return [orjson.loads(line) for _, line, _ in gen.lines()]


def _request(record: dict, **extra) -> api.ChatCompletionRequest:
    body = {"model": "champion", "messages": record["request"]["messages"], "tools": record["request"]["tools"],
            "user": record["customer_id"], **extra}
    return api.parse_request(json.dumps(body).encode())


def test_a_served_request_renders_exactly_the_prompt_training_saw() -> None:
    checked = 0
    for record in _records():
        row = prepare_line(orjson.dumps(record))
        if any(row[k] for k in row if k.startswith("redacted_")):
            continue  # PII: training sees it redacted, the gateway serves the caller's own text
        served = api.request_row(_request(record), now=datetime.fromisoformat(row["event_time"]))
        for style in ("names", "short", "full"):
            assert (chat_turns(system_for(served.row, style), served.row["messages_json"])
                    == chat_turns(system_for(row, style), row["messages_json"])), (record["record_id"], style)
        checked += 1
    assert checked > 100


def test_answers_become_tool_calls_or_content() -> None:
    specs = [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]
    call = api.answer('{"name":"get_order","arguments":{"order_id":"ord_1"}}', specs)
    assert call["finish_reason"] == "tool_calls" and call["message"]["content"] is None
    function = call["message"]["tool_calls"][0]["function"]
    assert function["name"] == "get_order" and json.loads(function["arguments"]) == {"order_id": "ord_1"}
    assert api.answer('{"name":null}', specs) == {"message": {"role": "assistant", "content": ""},
                                                  "finish_reason": "stop"}
    unoffered = api.answer('{"name":"refund","arguments":{}}', specs)  # never a call to a tool not offered
    assert unoffered["finish_reason"] == "stop" and unoffered["message"]["content"] == '{"name":"refund","arguments":{}}'
    assert api.answer("sure, let me check", specs)["message"]["content"] == "sure, let me check"


def test_streamed_chunks_rebuild_the_same_answer() -> None:
    record = _records(5)[0]
    request = _request(record)
    served = api.request_row(request)
    name = served.specs[0]["function"]["name"]
    body = api.completion(served, "champion", api.answer(json.dumps({"name": name, "arguments": {"a": 1}}),
                                                         served.specs), 100, 9, "tool_router_v1")
    chunks = api.chunks(body, include_usage=True)
    assert {c["id"] for c in chunks} == {body["id"]} and chunks[-1]["usage"] == body["usage"]
    arguments = "".join(d["function"].get("arguments", "") for c in chunks for ch in c["choices"]
                        for d in ch["delta"].get("tool_calls", []))
    assert arguments == body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


@pytest.mark.parametrize("body, status, where", [
    (b"{not json", 400, "parse the JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"model": "champion", "messages": []}).encode(), 400, "'messages'"),
    (json.dumps({"model": "champion", "messages": [{"role": "assistant", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "a"}}]}).encode(), 400, "user message"),
    (json.dumps({"model": "champion", "messages": [{"role": "user", "content": "hi"}]}).encode(), 400, "tools"),
    (json.dumps({"model": "champion", "messages": [{"role": "user", "content": "hi"}],
                 "tools": [{"type": "function", "function": {"name": "a"}}],
                 "tool_choice": {"type": "function", "function": {"name": "b"}}}).encode(), 400, "tool_choice"),
    (json.dumps({"model": "champion", "messages": [{"role": "user", "content": "x" * 5000}]}).encode(), 413, "at most"),
    (b"[" * 2000 + b"]" * 2000, 400, "nested too deeply"),  # was a 500 and a traceback
])
def test_bad_requests_are_openai_style_errors(body: bytes, status: int, where: str) -> None:
    with pytest.raises(api.ApiError) as caught:
        api.parse_request(asyncio.run(read_body(_http_request(body, declared=True)[0], 4096)))
    assert caught.value.status == status and where in caught.value.message
    error = caught.value.body()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def _http_request(body: bytes, declared: bool, part: int = 1000) -> Any:
    """A Starlette request whose body arrives in parts, with or without a Content-Length."""
    from starlette.requests import Request

    parts = [body[i:i + part] for i in range(0, len(body), part)] or [b""]
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
    for record in _records(40)[:20]:
        request = _request(record, metadata={"session_id": "s-1", "channel": "web"})
        served = api.request_row(request)
        name = served.specs[-1]["function"]["name"]
        body = api.completion(served, "champion", api.answer(json.dumps({"name": name, "arguments": {}}), served.specs),
                              50, 5, "tool_router_v1")
        captured = api.capture_record(request, served, body, latency_ms=12.5, defaults=DEFAULTS)
        verdict = check_line(orjson.dumps(captured))
        assert verdict.ok or verdict.reason.value == "invalid_arguments", verdict  # {} may lack required args
        assert captured["session_id"] == "s-1" and captured["channel"] == "web" and captured["country"] == "US"
        assert captured["customer_id"] == record["customer_id"] and captured["model"] == "champion"
        if verdict.ok:
            row = prepare_line(orjson.dumps(captured))
            assert json.loads(call_text(row["target_json"])) == {"name": name, "arguments": {}}
    abstained = api.capture_record(request, served, api.completion(served, "champion", api.answer('{"name":null}', served.specs),
                                                                   50, 3, None), latency_ms=1, defaults=DEFAULTS)
    row = prepare_line(orjson.dumps(abstained))
    assert row["status"] == "clean" and json.loads(call_text(row["target_json"])) == {"name": None}


def test_concurrent_captures_are_whole_lines_rotated_and_partitioned_by_day(tmp_path: Path) -> None:
    writer = CaptureWriter(str(tmp_path / "raw"), rotate_bytes=4096)
    records = [{"record_id": f"r{i}", "timestamp": f"2026-11-2{i % 2}T10:00:00+00:00", "pad": "x" * 200}
               for i in range(200)]

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


def test_routes_change_atomically_with_history_and_the_gate_decides_by_agreement_and_errors(tmp_path: Path) -> None:
    from pipelines.config import load_settings
    from pipelines.gateway import routes as rt

    settings = load_settings(root=str(tmp_path), gateway={"gate_requests": 4, "min_agreement": 0.75,
                                                           "canary_max_error_share": 0.25})
    with pytest.raises(rt.RouteError, match="none is configured: set gateway.teacher_url"):
        rt.set_route(settings, "champion", "shadow")  # the route a candidate was trained to beat is no teacher
    settings = load_settings(root=str(tmp_path), gateway={"gate_requests": 4, "min_agreement": 0.75,
                                                           "canary_max_error_share": 0.25, "base_as_teacher": True})
    assert rt.route_of(rt.read_routes(settings), "champion") == {"mode": "serve"}
    for bad, message in ((("canary",), "strictly between"), (("fast",), "mode:")):
        with pytest.raises(rt.RouteError, match=message):
            rt.set_route(settings, "champion", *bad, share=1.0)
    shadow = rt.set_route(settings, "champion", "shadow")
    yes, no = {"name": True, "exact": True, "arg_f1": 1.0}, {"name": False, "exact": False, "arg_f1": 0.0}

    def tally(*answers) -> rt.Tally:
        t = rt.Tally(shadow["since"])
        for a in answers:
            t.add(a if a != "error" else None, a == "error")
        return t

    assert rt.decide(settings, shadow, tally(yes, yes, no)) is None  # too few compared
    # a sequential test: 4 of 4 agreeing is a handful, not evidence (the always-valid interval spans 0.75) ...
    assert rt.decide(settings, shadow, tally(yes, yes, yes, yes)) is None
    # ... 60 of 60 is, and the reason states the interval and n
    moved = rt.decide(settings, shadow, tally(*[yes] * 60))
    assert moved[0] == "canary" and "always-valid 95% CI [0.8" in moved[1] and "n=60" in moved[1], moved
    assert rt.decide(settings, shadow, tally(*[no] * 60)) is None  # shadow never demotes: callers unaffected
    canary = rt.set_route(settings, "champion", "canary", share=0.3, reason="test")
    assert rt.decide(settings, canary, tally(*[yes] * 60)) is None
    assert rt.canary_ready(settings, canary, tally(*[yes] * 60))[0]
    waiting = rt.canary_ready(settings, canary, tally(yes, yes, yes, no))
    assert not waiting[0] and waiting[1].startswith("undecided"), waiting
    assert rt.decide(settings, canary, tally(yes, no, no, no)) is None, "one in four is not a failure yet either"
    failed = rt.decide(settings, canary, tally(yes, *[no] * 59))
    assert failed[0] == "serve" and "agreement" in failed[1]
    errored = rt.decide(settings, canary, tally(yes, yes, "error", "error"))
    assert errored[0] == "serve" and "errored" in errored[1]
    # the offline gate's veto, live: one write the reference did not make ends a shadow or a canary at once,
    # however well the rest agrees (and however few requests were compared)
    wrote = {"name": False, "exact": False, "arg_f1": 0.0, "wrong_write": "wrong_tool"}
    for route in (shadow, canary):
        vetoed = rt.decide(settings, route, tally(yes, wrote))
        assert vetoed[0] == "serve" and vetoed[1].startswith("refused: wrong writes 1 of 2"), vetoed
    assert not rt.canary_ready(settings, canary, tally(yes, yes, yes, yes, wrote))[0]
    lenient = load_settings(root=str(tmp_path), gateway={"gate_requests": 4, "min_agreement": 0.75},
                            promotion={"max_extra_wrong_writes": 1})
    assert rt.decide(lenient, shadow, tally(yes, wrote)) is None
    assert rt.agreement({"name": "send_invoice", "arguments": {"invoice_id": "INV-0000001"}},
                        {"name": "send_invoice", "arguments": {"invoice_id": "INV-0000002"}})["wrong_write"] == "other_ids"
    assert rt.set_route(settings, "champion", "serve", expect="shadow")["mode"] == "canary"  # moved meanwhile: kept
    history = rt.read_routes(settings)["history"]
    assert [(h["from"], h["to"]) for h in history] == [("serve", "shadow"), ("shadow", "canary")]
    (tmp_path / "serving" / "routes.json").write_text("{torn")
    with pytest.raises(rt.RouteError, match="not valid JSON"):
        rt.read_routes(settings)


def test_agreement_uses_the_evaluation_scoring() -> None:
    from pipelines.gateway.routes import agreement, call_of

    teacher = call_of({"tool_calls": [{"function": {"name": "get_order", "arguments": '{"order_id":"ORD-1"}'}}]})
    assert agreement(teacher, {"name": "get_order", "arguments": {"order_id": "ORD-1"}}) == \
        {"name": True, "exact": True, "arg_f1": 1.0, "wrong_write": None}
    assert agreement(teacher, {"name": "get_order", "arguments": {"order_id": "ORD-2"}})["exact"] is False
    assert agreement(teacher, {"name": None})["name"] is False
    assert call_of({"content": "no tool"}) == {"name": None}


def test_the_latest_rating_of_a_record_replaces_its_feedback_in_prep(tmp_path: Path) -> None:
    from pipelines.logs.feedback import feedback_zone, read_feedback

    raw = str(tmp_path / "raw")
    ratings = CaptureWriter(feedback_zone(raw), 1 << 20)
    record = _records(3)[0]
    for at, rating in (("2026-11-21T10:00:00+00:00", "down"), ("2026-11-22T09:00:00+00:00", "up"),
                       ("2026-11-21T11:00:00+00:00", "down")):  # written out of order: the latest time wins
        ratings.write({"record_id": record["record_id"], "rating": rating, "timestamp": at})
    ratings.write({"record_id": "other", "rating": "meh", "timestamp": "2026-11-22T09:00:00+00:00"})  # not a rating
    ratings.close()
    with open(next(Path(feedback_zone(raw)).glob("dt=2026-11-22/*.jsonl")), "ab") as torn:
        torn.write(b'{"record_id": "x", "rat')  # a killed gateway's last line
    assert read_feedback(raw) == {record["record_id"]: "up"}
    assert prepare_line(orjson.dumps(record), feedback=read_feedback(raw))["feedback"] == "up"
    assert prepare_line(orjson.dumps(record))["feedback"] == record["feedback"]


def test_the_recorded_tally_skips_skipped_comparisons_and_a_canary_needs_comparisons_to_pass(tmp_path: Path) -> None:
    from pipelines.config import load_settings
    from pipelines.gateway import routes as rt
    from pipelines.gateway.traffic import agreement_zone, tally_of

    settings = load_settings(root=str(tmp_path), gateway={"gate_requests": 3, "min_agreement": 0.5,
                                                           "canary_max_error_share": 0.2, "base_as_teacher": True})
    route = rt.set_route(settings, "champion", "canary", share=0.5)
    writer = CaptureWriter(agreement_zone(settings), 1 << 20)
    yes = {"name": True, "exact": True, "arg_f1": 1.0}

    def record(i: int, **fields) -> None:
        writer.write({"record_id": f"c{i}", "timestamp": "2999-01-01T00:00:00+00:00", "route": "champion",
                      "mode": "canary", "arm": "candidate", "agreement": None, "error": None, "skipped": False,
                      **fields})

    for i in range(3):  # the teacher never answered: skipped, no evidence either way
        record(i, skipped=True, error="skipped: comparison queue full")
    record(3, arm="champion")
    writer.close()
    tally = tally_of(settings, "champion", route)
    assert (tally.candidate_requests, tally.candidate_errors, tally.compared) == (0, 0, 0)
    for i in range(3):
        tally.add(None, False)  # answered by the candidate, never compared
    ready, why = rt.canary_ready(settings, route, tally)
    assert not ready and "compared" in why
    for i in range(20):  # 20 of 20 agreeing: the always-valid interval lies above 0.5
        tally.add(yes, False)
    assert rt.canary_ready(settings, route, tally)[0]


def test_malformed_call_arguments_more_than_one_answer_and_short_keys_are_refused(tmp_path: Path) -> None:
    from pipelines.config import ConfigError, load_settings
    from pipelines.gateway.app import api_key

    history = [{"role": "user", "content": "track it"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "track", "arguments": "{not json"}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "{}"}]
    tools = [{"type": "function", "function": {"name": "track"}}]
    for body in ({"model": "champion", "messages": history, "tools": tools},
                 {"model": "champion", "messages": history[:1], "tools": tools, "n": 2}):
        with pytest.raises(api.ApiError) as caught:
            api.parse_request(json.dumps(body).encode())
        assert caught.value.status == 400
    for key in ("", "short"):
        with pytest.raises(ConfigError, match="at least"):
            api_key(load_settings(root=str(tmp_path), gateway={"api_key": key}))


def test_a_cut_or_free_text_answer_is_never_a_training_label() -> None:
    specs = [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}]
    served = api.request_row(api.parse_request(json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                           "tools": specs}).encode()))
    cut = api.answer('{"name":"get_order","arguments":{"order_id":"OR', specs, cut=True)
    assert cut["finish_reason"] == "length"
    for choice, label in ((cut, False), (api.answer("hello", specs), False), (api.answer('{"name":null}', specs), True),
                          (api.answer('{"name":"get_order","arguments":{}}', specs), True)):
        assert api.is_label(api.completion(served, "m", choice, 1, 1, None)) is label


def _streamed(texts: list[str], body: dict, final_text: str | None, names: set[str],
              whole: set[str] | None = None) -> tuple[list[dict], dict]:
    from pipelines.gateway.streaming import ToolCallStream

    stream = ToolCallStream(body["id"], body["created"], body["model"], names, whole)
    out = [c for t in texts for c in stream.grow(t)]
    return out + stream.finish(body, final_text, include_usage=True), body


def _assembled(chunks: list[dict]) -> tuple[str | None, str, str | None, str, str | None]:
    """(call id, arguments, name, content, finish reason) as the openai client accumulates them."""
    call_id, name, arguments, content, finish = None, None, "", "", None
    for c in chunks:
        for ch in c["choices"]:
            finish = ch["finish_reason"] or finish
            content += ch["delta"].get("content") or ""
            for d in ch["delta"].get("tool_calls", []):
                call_id = d.get("id") or call_id
                name = d["function"].get("name") or name
                arguments += d["function"].get("arguments", "")
    return call_id, arguments, name, content, finish


def test_a_streamed_call_goes_out_as_it_grows_and_ends_as_the_answer_the_caller_assembled() -> None:
    record = _records(5)[0]
    served = api.request_row(_request(record))
    name = served.specs[0]["function"]["name"]
    text = json.dumps({"name": name, "arguments": {"order_id": "ORD-12", "note": "caf\u00e9"}}, separators=(",", ":"),
                      ensure_ascii=True)  # the model's escapes differ from the body's re-serialization
    prefixes = [text[:i] for i in range(1, len(text) + 1)]
    body = api.completion(served, "champion", api.answer(text, served.specs, response_id=served.response_id),
                          100, 30, "tool_router_v1")
    before = json.loads(json.dumps(body))  # what the gateway captured, before the stream closed
    chunks, body = _streamed(prefixes, body, text, {s["function"]["name"] for s in served.specs})
    assert {c["id"] for c in chunks} == {served.response_id}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # at the first token, before the name
    header = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
    assert header == 1 and chunks[header]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == name
    argument_chunks = [c for c in chunks[header + 1:] if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert len(argument_chunks) > 10  # streamed piece by piece, not in one go at the end
    call_id, arguments, got_name, content, finish = _assembled(chunks)
    assert (got_name, finish, content) == (name, "tool_calls", "")
    assert json.loads(arguments) == {"order_id": "ORD-12", "note": "caf\u00e9"}
    for sent in (before, body):  # captured = what the caller saw
        call = sent["choices"][0]["message"]["tool_calls"][0]
        assert (call["id"], call["function"]["arguments"]) == (call_id, arguments)
    assert chunks[-1]["usage"] == body["usage"]


def test_a_no_tool_answer_a_cut_call_and_a_teacher_answer_close_the_stream_correctly() -> None:
    record = _records(5)[0]
    served = api.request_row(_request(record))
    names = {s["function"]["name"] for s in served.specs}
    name = sorted(names)[0]

    abstain = '{"name":null}'
    body = api.completion(served, "champion", api.answer(abstain, served.specs), 100, 5, "m")
    chunks, _ = _streamed([abstain[:i] for i in range(1, len(abstain) + 1)], body, abstain, names)
    assert _assembled(chunks)[1:] == ("", None, "", "stop")
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1

    cut = f'{{"name":"{name}","arguments":{{"order_id":"ORD-'
    body = api.completion(served, "champion", api.answer(cut, served.specs, cut=True), 100, 64, "m")
    chunks, _ = _streamed([cut[:i] for i in range(1, len(cut) + 1)], body, cut, names)
    call_id, arguments, got_name, _, finish = _assembled(chunks)
    assert (got_name, arguments, finish) == (name, '{"order_id":"ORD-', "length")

    # the teacher answers whole (no text streamed): the whole answer, as chunks() makes it
    whole = json.dumps({"name": name, "arguments": {"a": 1}}, separators=(",", ":"))
    body = api.completion(served, "champion", api.answer(whole, served.specs), 100, 9, "teacher")
    chunks, _ = _streamed([], body, None, names)
    assert _assembled(chunks)[1:] == ('{"a":1}', name, "", "tool_calls")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


def test_a_redaction_token_never_reaches_a_caller_streamed_or_not() -> None:
    """A model trained on redacted logs may answer `<EMAIL>` for a `format: email` field: the gateway fills in
    the one email the conversation states, or asks for it instead of passing a placeholder on."""
    tools = [{"type": "function", "function": {"name": "send_invoice_to", "parameters": {
        "type": "object", "required": ["email"], "properties": {"email": {"type": "string", "format": "email"}}}}}]

    def served_for(text: str) -> api.Served:
        return api.request_row(api.parse_request(json.dumps({
            "model": "champion", "tools": tools, "messages": [{"role": "user", "content": text}]}).encode()))

    placeholder = '{"name":"send_invoice_to","arguments":{"email":"<EMAIL>"}}'
    one = served_for("bill ana.lima@example.com for the catering, 120 EUR")
    filled = api.answer(placeholder, one.specs, response_id=one.response_id, stated=api.stated_texts(one))
    assert json.loads(filled["message"]["tool_calls"][0]["function"]["arguments"]) == {"email": "ana.lima@example.com"}
    names = {"send_invoice_to"}
    for text in ("bill the client for the catering", "bill ana@example.com or bo@example.com, whichever"):
        served = served_for(text)
        refused = api.answer(placeholder, served.specs, response_id=served.response_id, stated=api.stated_texts(served))
        assert refused["finish_reason"] == "stop" and "email address" in refused["message"]["content"]
        assert "<EMAIL>" not in json.dumps(refused) and not refused["message"].get("tool_calls")
        body = api.completion(served, "champion", refused, 10, 10, "m")
        assert not api.is_label(body), "never a training label"
        chunks, _ = _streamed([placeholder[:i] for i in range(1, len(placeholder) + 1)], body, placeholder, names)
        assert "<EMAIL>" not in json.dumps(chunks) and "<" not in _assembled(chunks)[1]
        assert _assembled(chunks)[3] == refused["message"]["content"] and _assembled(chunks)[4] == "stop", \
            "a streaming caller gets the reason, not a call"
    body = api.completion(one, "champion", filled, 10, 10, "m")
    chunks, _ = _streamed([placeholder[:i] for i in range(1, len(placeholder) + 1)], body, placeholder, names)
    assert "<EMAIL>" not in json.dumps(chunks)
    assert json.loads(_assembled(chunks)[1]) == {"email": "ana.lima@example.com"} and _assembled(chunks)[4] == "tool_calls"


def test_a_call_that_breaks_what_the_grammar_left_out_is_not_passed_on() -> None:
    tools = [{"type": "function", "function": {"name": "tag", "parameters": {"type": "object", "required": ["labels"],
              "properties": {"labels": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}}]
    served = api.request_row(api.parse_request(json.dumps({
        "model": "champion", "tools": tools, "messages": [{"role": "user", "content": "tag it red and blue"}]}).encode()))
    fine = api.answer('{"name":"tag","arguments":{"labels":["red","blue"]}}', served.specs)
    assert fine["finish_reason"] == "tool_calls"
    twice = api.answer('{"name":"tag","arguments":{"labels":["red","red"]}}', served.specs)
    assert twice["finish_reason"] == "stop" and not twice["message"].get("tool_calls")
    assert twice["message"]["content"].startswith("error: the answer's tag call breaks its schema")
    # streamed: a partly constrained tool's call goes out whole at the end, so a refused one never starts
    text = '{"name":"tag","arguments":{"labels":["red","red"]}}'
    body = api.completion(served, "champion", twice, 10, 10, "m")
    chunks, _ = _streamed([text[:i] for i in range(1, len(text) + 1)], body, text, {"tag"}, {"tag"})
    assert "tool_calls" not in json.dumps(chunks) and _assembled(chunks)[3] == twice["message"]["content"]
    good = '{"name":"tag","arguments":{"labels":["red","blue"]}}'
    body = api.completion(served, "champion", fine, 10, 10, "m")
    chunks, _ = _streamed([good[:i] for i in range(1, len(good) + 1)], body, good, {"tag"}, {"tag"})
    assert json.loads(_assembled(chunks)[1]) == {"labels": ["red", "blue"]} and _assembled(chunks)[4] == "tool_calls"


def test_past_its_concurrency_limit_the_gateway_answers_429_at_once_and_its_probes_still_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
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
        entered.release()
        assert release.wait(30)
        return {"id": "chatcmpl-x", "choices": []}

    monkeypatch.setattr(Traffic, "handle", handle)
    settings = load_settings(root=str(tmp_path), gateway={"max_concurrent_requests": 3})
    body = {"model": "champion", "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}]}
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
        assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "rate_limit_exceeded"
                   for r in refused)
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200  # slots freed
        # a streamed request that fails before its generation starts: a 500, and its slot is released
        def broken(*_args, **_kwargs):
            raise ValueError("no row")

        monkeypatch.setattr(api, "request_row", broken)
        for _ in range(4):  # more failures than slots: a leak would turn the next request into a 429
            assert client.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers).status_code == 500
        monkeypatch.undo()
        monkeypatch.setattr(Traffic, "handle", handle)
        assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200


def test_what_the_gateway_keeps_at_rest_is_redacted_and_expires(tmp_path: Path) -> None:
    """Unusable answers and live comparisons live outside the raw zone (no prep redacts them): they are
    written redacted, and their day partitions older than gateway.retention_days are deleted at start."""
    from pipelines.gateway.capture import expire
    from pipelines.gateway.traffic import _redacted

    kept = _redacted({"messages": [{"role": "user", "content": "bill ana.lima@example.com, card 4111 1111 1111 1111"}],
                      "arguments": '{"recipient_email":"ana.lima@example.com"}'})
    assert "ana.lima@example.com" not in json.dumps(kept) and "4111 1111" not in json.dumps(kept)
    assert "<EMAIL>" in kept["messages"][0]["content"] and "<CARD>" in kept["messages"][0]["content"]
    zone = tmp_path / "unusable"
    for day in ("2026-10-01", "2026-11-20", "2026-11-25"):
        (zone / f"dt={day}").mkdir(parents=True)
        (zone / f"dt={day}" / "a.jsonl").write_text("{}\n")
    gone = expire(str(zone), 30, today="2026-11-26")
    assert [Path(g).name for g in gone] == ["dt=2026-10-01"]
    assert sorted(p.name for p in zone.iterdir()) == ["dt=2026-11-20", "dt=2026-11-25"]


def test_the_routing_table_is_rebuilt_when_a_deploy_changes_the_serving_state_not_per_request(
        tmp_path: Path, monkeypatch) -> None:
    """Triton's loaded models and the serving state are read once, then again after a deploy rewrote the
    state (and the models' declared inputs are read afresh), after a model error, or on a timer."""
    from pipelines.config import load_settings
    from pipelines.gateway import router as routing
    from pipelines.serve import deploy
    from pipelines.storage import write_json

    settings = load_settings(root=str(tmp_path))
    v1, v2 = (f"{settings.triton.model_name}_v{n}" for n in (1, 2))

    class Triton:
        listed, forgotten, models = 0, 0, [v1]

        def loaded(self) -> list[str]:
            Triton.listed += 1
            return list(Triton.models)

        def forget_inputs(self) -> None:
            Triton.forgotten += 1

    router = routing.Router(settings)
    router._client, router._candidate, router._styles = Triton(), (float("inf"), None), {v1: "names", v2: "names"}
    entry = {v: {"name": f"{settings.triton.model_name}_v{v}", "version": v, "prompt_style": "names"} for v in "12"}
    state_uri = f"{settings.zone('serving')}/state.json"
    write_json(state_uri, {"live": entry["1"], "previous": None, "history": []})
    assert router.targets()["champion"].version == "1"
    assert all(router.targets()["champion"].version == "1" for _ in range(50)) and Triton.listed == 1
    Triton.models = [v1, v2]
    write_json(state_uri, {"live": entry["2"], "previous": entry["1"], "history": []})  # a deploy
    found = router.targets()
    assert (found["champion"].version, found["previous"].version) == ("2", "1")
    assert Triton.listed == 2 and Triton.forgotten == 1
    router.invalidate()  # what a model error does
    router.targets()
    assert Triton.listed == 3
    monkeypatch.setattr(routing, "TARGETS_TTL_S", 0.0)  # and the timer
    router.targets()
    assert Triton.listed == 4 and deploy.state_stamp(settings) is not None
    assert router.readiness()["ready"] is True and Triton.listed == 5  # a probe looks now, never at the cache

    class Racing(Triton):
        def loaded(self) -> list[str]:
            router.invalidate()  # a model error while this rebuild runs: its table is out of date already
            return super().loaded()

    monkeypatch.setattr(routing, "TARGETS_TTL_S", 5.0)
    router._client = Racing()
    router.invalidate()
    router.targets()
    router._client = Triton()
    router.targets()
    router.targets()
    assert Triton.listed == 7  # rebuilt, rebuilt again (the invalidation during the first), then cached

    class Down(Triton):
        def loaded(self) -> list[str]:
            Triton.listed += 1
            raise ConnectionError("connection refused")

    monkeypatch.setattr(routing, "TARGETS_TTL_S", 0.0)
    monkeypatch.setattr(routing, "TARGETS_RETRY_S", 3600.0)  # no retry inside this test, however slow the machine
    router._client = Down()  # Triton went away: one try, then the last table serves until the retry
    assert router.targets()["champion"].version == "2" and Triton.listed == 8
    assert router.targets()["champion"].version == "2" and Triton.listed == 8
    assert router.readiness()["ready"] is False
    monkeypatch.setattr(routing, "TARGETS_STALE_S", 0.0)  # too old to trust while it cannot be rebuilt
    with pytest.raises(RuntimeError, match="did not answer a moment ago"):
        router.targets()
    monkeypatch.setattr(routing, "TARGETS_STALE_S", 60.0)
    write_json(state_uri, {"live": entry["1"], "previous": None, "history": []})  # a rollback while Triton is down
    with pytest.raises(RuntimeError, match="did not answer a moment ago"):
        router.targets()  # never the rolled-back champion from the old table
    fresh = routing.Router(settings)  # a gateway that never had a table fails, once per second, not per request
    fresh._client, fresh._candidate = Down(), (float("inf"), None)
    with pytest.raises(ConnectionError):
        fresh.targets()
    with pytest.raises(RuntimeError, match="did not answer a moment ago"):
        fresh.targets()
    assert Triton.listed == 10
