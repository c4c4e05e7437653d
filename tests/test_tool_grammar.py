"""Schema-constrained tool calls (pipelines.serve.tool_grammar): what the grammar admits, and decoding under it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pipelines.config import load_settings
from pipelines.evaluate.generate import generate
from pipelines.logs.tools import TOOLS_BY_NAME
from pipelines.prep.prompt import tools_json
from pipelines.serve.tool_grammar import GrammarError, accepts, call_schema, grammar_for
from pipelines.train.models import load_base

ORDERS = tools_json([TOOLS_BY_NAME["get_order"], TOOLS_BY_NAME["search_products"]])

# bounded arguments only (enums, ranges, short strings): any answer the grammar admits fits in the token budget
BOUNDED = json.dumps([
    {"name": "track", "description": "", "parameters": {
        "type": "object", "required": ["carrier", "days"],
        "properties": {"carrier": {"type": "string", "enum": ["ups", "dhl", "fedex"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 30},
                       "note": {"type": "string", "maxLength": 6}}}},
    {"name": "refund", "description": "", "parameters": {
        "type": "object", "required": ["order"],
        "properties": {"order": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                       "full": {"type": "boolean"}}}},
])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return load_base("tiny-llama", load_settings(root=str(tmp_path_factory.mktemp("grammar"))))


def test_the_grammar_admits_offered_calls_and_abstention_only(tiny) -> None:
    _, tok = tiny
    assert accepts(tok, ORDERS, '{"name":"get_order","arguments":{"order_id":"ORD-123456"}}')
    assert accepts(tok, ORDERS, '{"name": null}') and accepts(tok, ORDERS, '{"name":null}')
    # an argument name the schema does not have (the tuned model's `tracking_id` habit)
    assert not accepts(tok, ORDERS, '{"name":"get_order","arguments":{"order_number":"ORD-123456"}}')
    # a wrong type
    assert not accepts(tok, ORDERS, '{"name":"search_products","arguments":{"query":"mug","max_price":"cheap"}}')
    # a tool that exists but is not offered in this turn, and one that does not exist
    assert not accepts(tok, ORDERS, '{"name":"get_invoice","arguments":{"invoice_id":"INV-1"}}')
    assert not accepts(tok, ORDERS, '{"name":"nope","arguments":{}}')
    # a missing required argument, an enum value outside the list, and free text around the call
    assert not accepts(tok, ORDERS, '{"name":"get_order","arguments":{}}')
    assert not accepts(tok, ORDERS, '{"name":"search_products","arguments":{"category":"cars","query":"x"}}')
    assert not accepts(tok, ORDERS, 'Sure: {"name": null}')
    # a turn that offers no tool: abstention is the only answer
    assert accepts(tok, "[]", '{"name": null}') and not accepts(tok, "[]", '{"name":"get_order","arguments":{}}')


def test_a_schema_the_grammar_cannot_express_is_an_error_naming_the_tool() -> None:
    bad = json.dumps([{"name": "tag", "parameters": {"type": "object", "properties": {
        "labels": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}])
    with pytest.raises(GrammarError, match="tool tag: .*uniqueItems"):
        grammar_for(bad)
    with pytest.raises(GrammarError, match="not JSON"):
        grammar_for("[{")


def test_constrained_decoding_of_a_tiny_model_always_parses_and_validates(tiny) -> None:
    model, tok = tiny
    requests = [[{"role": "system", "content": "Tools: track, refund"}, {"role": "user", "content": text}]
                for text in ("where is my parcel", "refund ORD-1234 please", "hello", "track it with dhl",
                             "give me my money back", "what is the weather", "days 4", "note this")]
    free = generate(model, tok, requests, max_new_tokens=48, batch_size=4, latency_samples=0)
    assert not all(_valid(t) for t in free.texts)  # an untrained model does not write tool calls by itself
    out = generate(model, tok, requests, max_new_tokens=48, batch_size=4, latency_samples=1,
                   tools=[BOUNDED] * len(requests))
    for text in out.texts:
        assert _valid(text), text


def _valid(text: str) -> bool:
    """Parses, names an offered tool (or abstains) and its arguments validate against that tool's schema."""
    try:
        call = json.loads(text)
        jsonschema.validate(call, call_schema(BOUNDED))
    except (ValueError, jsonschema.ValidationError):
        return False
    if call["name"] is None:
        return True
    offered = {t["name"]: t["parameters"] for t in json.loads(BOUNDED)}
    jsonschema.validate(call["arguments"], offered[call["name"]])
    return True


def test_evaluation_refuses_tools_it_cannot_enforce_in_one_line(tiny) -> None:
    from pipelines.errors import NotRetryable

    model, tok = tiny
    bad = json.dumps([{"name": "tag", "parameters": {"type": "object", "properties": {"x": {"not": {}}}}}])
    with pytest.raises(NotRetryable, match=r"^constrained decoding: tool tag: .*not.*evaluation.constrained: off"):
        generate(model, tok, [[{"role": "user", "content": "hi"}]], tools=[bad], latency_samples=0)
