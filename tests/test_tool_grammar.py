"""Schema-constrained tool calls (pipelines.toolcall.grammar): what the grammar admits, and decoding under it."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from pipelines.base_models import load_base
from pipelines.config import load_settings
from pipelines.logs.tools import TOOLS_BY_NAME
from pipelines.toolcall.decode import generate
from pipelines.toolcall.grammar import GrammarError, accepts, grammar_for
from pipelines.toolcall.prompt import tools_json

ORDERS = tools_json([TOOLS_BY_NAME["get_order"], TOOLS_BY_NAME["search_products"]])

# bounded arguments only (enums, ranges, short strings): any answer the grammar admits fits in the token budget
BOUNDED = json.dumps(
    [
        {
            "name": "track",
            "description": "",
            "parameters": {
                "type": "object",
                "required": ["carrier", "days"],
                "properties": {
                    "carrier": {"type": "string", "enum": ["ups", "dhl", "fedex"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 30},
                    "note": {"type": "string", "maxLength": 6},
                },
            },
        },
        {
            "name": "refund",
            "description": "",
            "parameters": {
                "type": "object",
                "required": ["order"],
                "properties": {"order": {"type": "string", "pattern": "^ORD-[0-9]{4}$"}, "full": {"type": "boolean"}},
            },
        },
    ]
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    return load_base("tiny-llama", load_settings(root=str(tmp_path_factory.mktemp("grammar"))))


def test_the_grammar_admits_offered_calls_and_abstention_only(tiny) -> None:
    _, tok = tiny
    assert accepts(tok, ORDERS, '{"name":"get_order","arguments":{"order_id":"ORD-123456"}}')
    assert accepts(tok, ORDERS, '{"name":null}')  # abstention
    # one serialization per answer: compact, `name` first, arguments in sorted order (as the models were trained)
    assert not accepts(tok, ORDERS, '{"name": null}')
    assert not accepts(tok, ORDERS, '{"arguments":{"order_id":"ORD-123456"},"name":"get_order"}')
    assert accepts(tok, ORDERS, '{"name":"search_products","arguments":{"max_price":30,"query":"mug"}}')
    assert not accepts(tok, ORDERS, '{"name":"search_products","arguments":{"query":"mug","max_price":30}}')
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
    assert not accepts(tok, ORDERS, 'Sure: {"name":null}')
    # a turn that offers no tool: abstention is the only answer
    assert accepts(tok, "[]", '{"name":null}') and not accepts(tok, "[]", '{"name":"get_order","arguments":{}}')
    required = json.dumps({"tools": json.loads(ORDERS), "abstain": False})  # tool_choice: required
    assert accepts(tok, required, '{"name":"get_order","arguments":{"order_id":"ORD-123456"}}')
    assert not accepts(tok, required, '{"name":null}')
    with pytest.raises(GrammarError, match="no tool is offered"):
        grammar_for(json.dumps({"tools": [], "abstain": False}))


def test_a_keyword_the_grammar_lacks_is_left_out_of_that_tool_only_and_reported(tiny) -> None:
    """One tool with `uniqueItems` (llguidance does not implement it) no longer breaks the request: that
    tool is constrained without it (checked after decoding), the others fully; a schema that cannot be
    compiled at all (a look-behind pattern) is still one error naming the tool."""
    from pipelines.toolcall.grammar import partly_constrained

    _, tok = tiny
    tools = json.dumps(
        [
            {
                "name": "tag",
                "parameters": {
                    "type": "object",
                    "required": ["labels"],
                    "properties": {
                        "labels": {
                            "type": "array",
                            "items": {"type": "string", "enum": ["a", "b"]},
                            "uniqueItems": True,
                        }
                    },
                },
            },
            {"name": "get_order", "parameters": TOOLS_BY_NAME["get_order"]["function"]["parameters"]},
        ]
    )
    assert partly_constrained(tools) == {"tag": ["uniqueItems"]}
    assert accepts(tok, tools, '{"name":"tag","arguments":{"labels":["a","b"]}}')
    assert accepts(tok, tools, '{"name":"tag","arguments":{"labels":["a","a"]}}'), "left to the check after decoding"
    assert not accepts(tok, tools, '{"name":"tag","arguments":{"labels":["c"]}}'), "the rest is still enforced"
    assert not accepts(tok, tools, '{"name":"get_order","arguments":{"order_number":"ORD-123456"}}')
    bad = json.dumps(
        [{"name": "x", "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=a)b"}}}}]
    )
    with pytest.raises(GrammarError, match="tool x: .*look-behind"):
        grammar_for(bad)
    with pytest.raises(GrammarError, match="not JSON"):
        grammar_for("[{")
    huge = json.dumps([{"name": "n", "parameters": {"type": "object", "properties": {"a": {"maximum": 2**70}}}}])
    with pytest.raises(GrammarError, match="tool n: .*not JSON serializable"):  # llguidance's ValueError, named
        grammar_for(huge)


def test_constrained_decoding_of_a_tiny_model_always_parses_and_validates(tiny) -> None:
    model, tok = tiny
    requests = [
        [{"role": "system", "content": "Tools: track, refund"}, {"role": "user", "content": text}]
        for text in (
            "where is my parcel",
            "refund ORD-1234 please",
            "hello",
            "track it with dhl",
            "give me my money back",
            "what is the weather",
            "days 4",
            "note this",
        )
    ]
    free = generate(model, tok, requests, max_new_tokens=48, batch_size=4, latency_samples=0)
    assert not all(_valid(t) for t in free.texts)  # an untrained model does not write tool calls by itself
    out = generate(
        model, tok, requests, max_new_tokens=48, batch_size=4, latency_samples=1, tools=[BOUNDED] * len(requests)
    )
    for text in out.texts:
        assert _valid(text), text
    # the budget is accounted: the untrained free answers run to it, every grammar answer ended before it
    assert free.cut == sum(1 for n in free.output_tokens if n == 48) > 0
    assert free.stats()["cut_at_max_new_tokens"] == free.cut
    assert out.cut == 0 and max(out.output_tokens) < 48


def test_answer_lengths_and_cuts_do_not_depend_on_the_pad_token(tiny) -> None:
    """An answer is cut when it has no end token, whatever the pad token is: with a pad distinct from the
    end token, an answer whose end token lands on the budget's last slot ended (it is not cut)."""
    model, tok = tiny
    requests = [
        [{"role": "user", "content": text}] for text in ("where is my parcel", "refund ORD-1234", "hello", "note this")
    ]
    tools = [BOUNDED] * len(requests)
    whole = generate(model, tok, requests, max_new_tokens=48, batch_size=4, latency_samples=0, tools=tools)
    assert whole.cut == 0, whole.output_tokens
    shortest = min(whole.output_tokens)
    old = tok.pad_token
    try:
        other = next(t for t in tok.all_special_tokens if t != tok.eos_token)  # SmolLM2's <|endoftext|>
        # budgets: the shortest answer's end token just past the budget (cut), then on its last slot (ended)
        for pad, budget in itertools.product((tok.eos_token, other), (shortest, shortest + 1)):
            tok.pad_token = pad
            short = generate(model, tok, requests, max_new_tokens=budget, batch_size=4, latency_samples=0, tools=tools)
            assert short.output_tokens == [min(n, budget) for n in whole.output_tokens], (pad, short.output_tokens)
            expected_cut = sum(1 for n in whole.output_tokens if n >= budget)
            assert short.cut == expected_cut, (pad, budget, short.cut, expected_cut)
    finally:
        tok.pad_token = old


def _valid(text: str) -> bool:
    """Parses, names an offered tool (or abstains) and its arguments validate against that tool's own schema,
    checked independently of the grammar's (a patterned string may also be a redaction token, `<EMAIL>`,
    as in our redacted logs)."""
    from pipelines.toolcall.grammar import REDACTION_TOKENS

    try:
        call = json.loads(text)
    except ValueError:
        return False
    if not isinstance(call, dict) or set(call) - {"name", "arguments"}:
        return False
    if call.get("name") is None:
        return call == {"name": None}
    offered = {t["name"]: t["parameters"] for t in json.loads(BOUNDED)}
    if call["name"] not in offered or not isinstance(call.get("arguments"), dict):
        return False
    schema = {**offered[call["name"]], "additionalProperties": False}
    for error in jsonschema.Draft202012Validator(schema).iter_errors(call["arguments"]):
        if not (error.validator == "pattern" and error.instance in REDACTION_TOKENS):
            return False
    return True


def test_evaluation_refuses_tools_it_cannot_enforce_in_one_line(tiny) -> None:
    from pipelines.errors import NotRetryable

    model, tok = tiny
    bad = json.dumps(
        [
            {
                "name": "tag",
                "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "(?<=a)b"}}},
            }
        ]
    )
    with pytest.raises(
        NotRetryable,
        match=r"^constrained decoding: tool tag: .*look-behind.*"
        r"evaluation.constrained: off",
    ):
        generate(model, tok, [[{"role": "user", "content": "hi"}]], tools=[bad], latency_samples=0)


def test_every_training_target_of_generated_traffic_is_admitted(tiny) -> None:
    """The grammar never fights the training data: each prepared turn's target (redacted PII included,
    e.g. an invoice to `<EMAIL>`) is an answer its own offered tools' grammar admits."""
    from datetime import date

    from pipelines.prep.nodes import prepare_line
    from pipelines.redact import PII_TYPES
    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator
    from pipelines.toolcall.calls import call_text
    from pipelines.toolcall.grammar import REDACTION_TOKENS

    assert tuple(f"<{t}>" for t in PII_TYPES) == REDACTION_TOKENS
    _, tok = tiny
    gen = TrafficGenerator(GeneratorConfig(seed=2, records=600, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [r for r in (prepare_line(line) for _, line, _ in gen.lines()) if r["status"] == "clean"]
    assert any("<EMAIL>" in r["target_json"] for r in rows)  # redacted arguments are part of the sample
    rejected = [
        call_text(r["target_json"]) for r in rows if not accepts(tok, r["tools_json"], call_text(r["target_json"]))
    ]
    assert rejected == []
    # ids grounded in the conversation as served: every write's id in our traffic is one the customer stated
    from pipelines.logs.tools import WRITE_TOOLS
    from pipelines.toolcall.grounding import ground

    writes = [r for r in rows if json.loads(r["target_json"])["name"] in WRITE_TOOLS]
    assert writes and any('_id"' in r["target_json"] for r in writes)
    grounded = [
        call_text(r["target_json"])
        for r in writes
        if not accepts(tok, ground(r["tools_json"], json.loads(r["messages_json"]), {}), call_text(r["target_json"]))
    ]
    assert grounded == []


def test_a_write_cannot_target_an_id_the_conversation_never_stated(tiny) -> None:
    """Grounded ids: a write tool's `*_id`/`*_ids` arguments take only values from the user's words and the
    tool results; reads and free-text arguments are not limited; a write whose id nobody stated is not offered."""
    from pipelines.toolcall.grounding import ground

    _, tok = tiny
    tools = json.dumps(
        [
            {
                "name": "cancel_pending_order",
                "parameters": {
                    "type": "object",
                    "required": ["order_id", "reason"],
                    "properties": {
                        "order_id": {"type": "string"},
                        "reason": {"type": "string", "enum": ["no longer needed", "ordered by mistake"]},
                    },
                },
            },
            {
                "name": "return_items",
                "parameters": {
                    "type": "object",
                    "required": ["item_ids", "order_id"],
                    "properties": {
                        "order_id": {"type": "string"},
                        "item_ids": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
            {
                "name": "get_order_details",
                "parameters": {
                    "type": "object",
                    "required": ["order_id"],
                    "properties": {"order_id": {"type": "string"}},
                },
            },
        ]
    )
    effects = {"cancel_pending_order": "write", "return_items": "write", "get_order_details": "read"}
    turns = [
        {"role": "system", "content": "Orders #W9999 and #W8888 exist."},  # the system prompt states nothing
        {"role": "user", "content": "Please cancel #W1234, I no longer need it."},
        {"role": "assistant", "content": '{"name":"get_order_details","arguments":{"order_id":"#W5555"}}'},
        {"role": "user", "content": 'Tool result: {"order_id":"#W1234","items":[{"item_id":"111"},{"item_id":"222"}]}'},
    ]
    grounded = ground(tools, turns, effects)
    cancel = '{{"name":"cancel_pending_order","arguments":{{"order_id":"{}","reason":"no longer needed"}}}}'
    assert accepts(tok, grounded, cancel.format("#W1234"))
    for invented in ("#W1235", "#W9999", "#W5555", "#W123"):  # made up, from the system prompt, from its own call
        assert accepts(tok, tools, cancel.format(invented)), "the plain grammar admits any string"
        assert not accepts(tok, grounded, cancel.format(invented)), invented
    assert accepts(tok, grounded, '{"name":"return_items","arguments":{"item_ids":["222","111"],"order_id":"#W1234"}}')
    assert not accepts(tok, grounded, '{"name":"return_items","arguments":{"item_ids":["333"],"order_id":"#W1234"}}')
    assert accepts(tok, grounded, '{"name":"get_order_details","arguments":{"order_id":"#W7777"}}'), "reads are free"
    # nothing stated: the write cannot be offered, the read and abstention still can
    bare = ground(tools, [{"role": "user", "content": "cancel my last order"}], effects)
    assert [t["name"] for t in json.loads(bare)] == ["get_order_details"]
    assert accepts(tok, bare, '{"name":null}')
    with pytest.raises(GrammarError, match="every offered write tool needs an id"):
        ground(json.dumps({"tools": json.loads(tools)[:1], "abstain": False}), turns[:1], effects)


def test_each_row_of_a_batch_is_decoded_under_its_own_tools(tiny) -> None:
    """Left-padded batches mix turns with different tool sets, a turn offering none, and a free row."""
    import torch
    from transformers import LogitsProcessorList

    from pipelines.toolcall.decode import render_prompts
    from pipelines.toolcall.grammar import ToolCallConstraint

    model, tok = tiny
    ping = json.dumps([{"name": "ping", "parameters": {"type": "object", "properties": {}}}])
    turns = [
        [{"role": "user", "content": text}]
        for text in ("refund ORD-1234", "a much longer request here", "x", "ping me please now")
    ]
    out = generate(
        model, tok, turns, max_new_tokens=48, batch_size=4, latency_samples=0, tools=[BOUNDED, ping, "[]", ping]
    )
    pinged, abstained = {"name": "ping", "arguments": {}}, {"name": None}
    assert _valid(out.texts[0])
    assert json.loads(out.texts[1]) in (pinged, abstained) and json.loads(out.texts[3]) in (pinged, abstained)
    assert json.loads(out.texts[2]) == abstained
    # a row without tools in the same batch is decoded freely (the processor leaves it alone)
    tok.padding_side = "left"
    enc = tok(render_prompts(tok, turns[:2]), return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        ids = model.generate(
            **enc,
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
            logits_processor=LogitsProcessorList([ToolCallConstraint(tok, [None, "[]"])]),
        )
    texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    with torch.inference_mode():
        free = model.generate(**enc, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    assert json.loads(texts[1]) == abstained
    assert texts[0] == tok.batch_decode(free[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)[0]


def test_nested_schemas_under_defs_are_closed_and_ordered_like_top_level_ones(tiny) -> None:
    """A tool whose arguments use `$defs`/`$ref` (two tools may even name a definition alike): the
    referenced object admits only its own keys, in sorted order, like the top level."""
    from pipelines.toolcall.grammar import constraint

    _, tok = tiny
    address = {
        "type": "object",
        "required": ["city", "zip"],
        "properties": {"zip": {"type": "string", "maxLength": 5}, "city": {"type": "string", "maxLength": 8}},
    }
    tools = json.dumps(
        [
            {
                "name": "ship",
                "parameters": {
                    "type": "object",
                    "required": ["to"],
                    "properties": {
                        "to": {"$ref": "#/$defs/Address"},
                        "items": {"type": "array", "items": {"$ref": "#/$defs/Line"}},
                    },
                    "$defs": {
                        "Address": address,
                        "Line": {
                            "type": "object",
                            "required": ["sku"],
                            "properties": {"sku": {"type": "string", "enum": ["A1", "B2"]}, "qty": {"type": "integer"}},
                        },
                    },
                },
            },
            {
                "name": "bill",
                "parameters": {
                    "type": "object",
                    "required": ["to"],
                    "properties": {"to": {"$ref": "#/definitions/Address"}},
                    "definitions": {
                        "Address": {
                            "type": "object",
                            "required": ["iban"],
                            "properties": {"iban": {"type": "string", "maxLength": 8}},
                        }
                    },
                },
            },
        ]
    )
    assert accepts(tok, tools, '{"name":"ship","arguments":{"to":{"city":"Oslo","zip":"0150"}}}')
    assert accepts(
        tok, tools, '{"name":"ship","arguments":{"items":[{"qty":2,"sku":"A1"}],"to":{"city":"Oslo","zip":"0150"}}}'
    )
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"to":{"zip":"0150","city":"Oslo"}}}'), "unsorted"
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"to":{"city":"Oslo","x":1,"zip":"0150"}}}')
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"items":[{"sku":"C3"}],"to":{"city":"O","zip":"1"}}}')
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"to":{"city":"Oslo"}}}'), "a required key"
    # each tool's `Address` is its own
    assert accepts(tok, tools, '{"name":"bill","arguments":{"to":{"iban":"NO93"}}}')
    assert not accepts(tok, tools, '{"name":"bill","arguments":{"to":{"city":"Oslo","zip":"0150"}}}')
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"to":{"iban":"NO93"}}}')
    # pointers resolve inside their own tool whatever it is named: one name in both `$defs` and `definitions`,
    # tool names with a dot or a slash, a pointer to the tool's own root (a recursive schema)
    odd = json.dumps(
        [
            {
                "name": "a.b",
                "parameters": {
                    "type": "object",
                    "required": ["x"],
                    "properties": {"x": {"$ref": "#/$defs/A"}, "y": {"$ref": "#/definitions/A"}},
                    "$defs": {"A": {"type": "integer"}},
                    "definitions": {"A": {"type": "string", "maxLength": 3}},
                },
            },
            {
                "name": "a/b",
                "parameters": {
                    "type": "object",
                    "required": ["x"],
                    "properties": {"x": {"$ref": "#/definitions/A"}},
                    "definitions": {"A": {"type": "boolean"}},
                },
            },
            {
                "name": "tree",
                "parameters": {
                    "type": "object",
                    "required": ["v"],
                    "properties": {"kid": {"$ref": "#"}, "v": {"type": "integer"}},
                },
            },
        ]
    )
    assert accepts(tok, odd, '{"name":"a.b","arguments":{"x":7,"y":"abc"}}')
    assert not accepts(tok, odd, '{"name":"a.b","arguments":{"x":"abc"}}')
    assert accepts(tok, odd, '{"name":"a/b","arguments":{"x":true}}')
    assert accepts(tok, odd, '{"name":"tree","arguments":{"kid":{"kid":{"v":3},"v":2},"v":1}}')
    assert not accepts(tok, odd, '{"name":"tree","arguments":{"kid":{"name":null},"v":1}}')
    assert constraint("tree", json.loads(odd)[2]["parameters"]) == "fully"


def test_decoding_under_nested_and_partly_enforceable_tools_completes_and_validates(tiny) -> None:
    """What evaluation and serving decode: a turn offering a `$defs` tool and a `uniqueItems` tool is
    answered (no 400, no aborted evaluation), and each answer fits the schema but for the keyword left to
    the check after decoding."""
    model, tok = tiny
    ship = {
        "type": "object",
        "required": ["to"],
        "properties": {"to": {"$ref": "#/$defs/Address"}},
        "$defs": {
            "Address": {
                "type": "object",
                "required": ["city"],
                "properties": {
                    "city": {"type": "string", "enum": ["Oslo", "Lima"]},
                    "zip": {"type": "string", "maxLength": 5},
                },
            }
        },
    }
    tag = {
        "type": "object",
        "required": ["labels"],
        "properties": {
            "labels": {
                "type": "array",
                "items": {"type": "string", "enum": ["a", "b", "c"]},
                "maxItems": 3,
                "uniqueItems": True,
            }
        },
    }
    offered = [{"name": "ship", "parameters": ship}, {"name": "tag", "parameters": tag}]
    tools = json.dumps({"tools": offered, "abstain": False})  # a call is required: every answer is checked below
    requests = [[{"role": "user", "content": text}] for text in ("ship to Oslo", "tag it a and b", "hi", "ship 0150")]
    out = generate(model, tok, requests, max_new_tokens=64, batch_size=2, latency_samples=0, tools=[tools] * 4)
    assert out.cut == 0 and all(json.loads(text)["name"] in ("ship", "tag") for text in out.texts)
    enforced = {
        "ship": ship,
        "tag": {
            **tag,
            "properties": {"labels": {k: v for k, v in tag["properties"]["labels"].items() if k != "uniqueItems"}},
        },
    }
    for text in out.texts:
        call = json.loads(text)
        if call["name"] is not None:
            jsonschema.validate(call["arguments"], {**enforced[call["name"]], "additionalProperties": False})


def test_a_tool_with_its_own_id_or_anchors_compiles_as_it_did_before_it_moved_under_defs(tiny) -> None:
    """Pointers are rewritten when a tool moves under the answer schema's `$defs`: `#/...` ones only. A tool's
    own `$id` would resolve them against itself (it is dropped), anchors (`#name`) stay as written, and a
    nested schema with its own `$id` keeps its pointers; parameters that are no schema are reported, not raised."""
    from pipelines.toolcall.grammar import constraint

    _, tok = tiny
    own_id = {
        "$id": "https://example.com/ship.json",
        "type": "object",
        "required": ["to", "n"],
        "properties": {"to": {"$ref": "#/$defs/City"}, "n": {"$ref": "#count"}},
        "$defs": {
            "City": {"type": "string", "enum": ["Oslo", "Lima"]},
            "Count": {"$anchor": "count", "type": "integer"},
        },
    }
    tools = json.dumps([{"name": "ship", "parameters": own_id}])
    assert accepts(tok, tools, '{"name":"ship","arguments":{"n":2,"to":"Oslo"}}')
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"n":"2","to":"Oslo"}}')
    assert not accepts(tok, tools, '{"name":"ship","arguments":{"n":2,"to":"Rome"}}')
    assert constraint("ship", own_id) == "fully"
    assert constraint("odd", "not a schema").startswith("no: ") and constraint("odd", [1]).startswith("no: ")
