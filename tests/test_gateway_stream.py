"""The gateway's streamed answers without servers: a tool call goes out as it grows and ends as the answer the
caller assembles; a cut call, a no-tool answer and a teacher's answer close the stream; a redaction token or a
call that breaks the grammar never reaches a caller."""

from __future__ import annotations

import json

from gateway_records import chat_request, generated_records

from pipelines.gateway import openai_api as api


def test_streamed_chunks_rebuild_the_same_answer() -> None:
    record = generated_records(5)[0]
    request = chat_request(record)
    served = api.request_row(request)
    name = served.specs[0]["function"]["name"]
    body = api.completion(
        served,
        "champion",
        api.answer(json.dumps({"name": name, "arguments": {"a": 1}}), served.specs),
        100,
        9,
        "tool_router_v1",
    )
    chunks = api.chunks(body, include_usage=True)
    assert {c["id"] for c in chunks} == {body["id"]} and chunks[-1]["usage"] == body["usage"]
    arguments = "".join(
        d["function"].get("arguments", "")
        for c in chunks
        for ch in c["choices"]
        for d in ch["delta"].get("tool_calls", [])
    )
    assert arguments == body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"


def _streamed(
    texts: list[str], body: dict, final_text: str | None, names: set[str], whole: set[str] | None = None
) -> tuple[list[dict], dict]:
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
    record = generated_records(5)[0]
    served = api.request_row(chat_request(record))
    name = served.specs[0]["function"]["name"]
    text = json.dumps(
        {"name": name, "arguments": {"order_id": "ORD-12", "note": "caf\u00e9"}},
        separators=(",", ":"),
        ensure_ascii=True,
    )  # the model's escapes differ from the body's re-serialization
    prefixes = [text[:i] for i in range(1, len(text) + 1)]
    body = api.completion(
        served, "champion", api.answer(text, served.specs, response_id=served.response_id), 100, 30, "tool_router_v1"
    )
    before = json.loads(json.dumps(body))  # what the gateway captured, before the stream closed
    chunks, body = _streamed(prefixes, body, text, {s["function"]["name"] for s in served.specs})
    assert {c["id"] for c in chunks} == {served.response_id}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # at the first token, before the name
    header = next(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("tool_calls"))
    assert header == 1 and chunks[header]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"] == name
    argument_chunks = [c for c in chunks[header + 1 :] if c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert len(argument_chunks) > 10  # streamed piece by piece, not in one go at the end
    call_id, arguments, got_name, content, finish = _assembled(chunks)
    assert (got_name, finish, content) == (name, "tool_calls", "")
    assert json.loads(arguments) == {"order_id": "ORD-12", "note": "caf\u00e9"}
    for sent in (before, body):  # captured = what the caller saw
        call = sent["choices"][0]["message"]["tool_calls"][0]
        assert (call["id"], call["function"]["arguments"]) == (call_id, arguments)
    assert chunks[-1]["usage"] == body["usage"]


def test_a_no_tool_answer_a_cut_call_and_a_teacher_answer_close_the_stream_correctly() -> None:
    record = generated_records(5)[0]
    served = api.request_row(chat_request(record))
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
    tools = [
        {
            "type": "function",
            "function": {
                "name": "send_invoice_to",
                "parameters": {
                    "type": "object",
                    "required": ["email"],
                    "properties": {"email": {"type": "string", "format": "email"}},
                },
            },
        }
    ]

    def served_for(text: str) -> api.Served:
        return api.request_row(
            api.parse_request(
                json.dumps(
                    {"model": "champion", "tools": tools, "messages": [{"role": "user", "content": text}]}
                ).encode()
            )
        )

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
        assert _assembled(chunks)[3] == refused["message"]["content"] and _assembled(chunks)[4] == "stop", (
            "a streaming caller gets the reason, not a call"
        )
    body = api.completion(one, "champion", filled, 10, 10, "m")
    chunks, _ = _streamed([placeholder[:i] for i in range(1, len(placeholder) + 1)], body, placeholder, names)
    assert "<EMAIL>" not in json.dumps(chunks)
    assert (
        json.loads(_assembled(chunks)[1]) == {"email": "ana.lima@example.com"} and _assembled(chunks)[4] == "tool_calls"
    )


def test_a_call_that_breaks_what_the_grammar_left_out_is_not_passed_on() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "tag",
                "parameters": {
                    "type": "object",
                    "required": ["labels"],
                    "properties": {"labels": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
                },
            },
        }
    ]
    served = api.request_row(
        api.parse_request(
            json.dumps(
                {"model": "champion", "tools": tools, "messages": [{"role": "user", "content": "tag it red and blue"}]}
            ).encode()
        )
    )
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
