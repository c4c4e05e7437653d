"""Function-calling metrics against hand-computed cases."""

from __future__ import annotations

import pytest

from pipelines.toolcall.calls import INVALID, NO_TOOL, parse_call
from pipelines.toolcall.score import confusion, per_tool, score, summarize, text_f1

GOLD = {"name": "search_products", "arguments": {"query": "hoodie", "color": "red", "max_price": 40}}


def test_parse_call_finds_the_call_in_surrounding_text() -> None:
    assert parse_call('Sure! {"name": "get_order", "arguments": {"order_id": "ORD-1"}} done') == {
        "name": "get_order",
        "arguments": {"order_id": "ORD-1"},
    }
    assert parse_call('{"name": null}') == {"name": None, "arguments": {}}
    assert parse_call('{"name": "get_order", "arguments": "{\\"order_id\\": \\"X\\"}"}')["arguments"] == {
        "order_id": "X"
    }
    for bad in ("no json here", '{"order_id": 1}', '{"name": 3}', '{"name": "x", "arguments": [1]}', "{broken"):
        assert parse_call(bad) is None


def test_exact_match_compares_values_as_json() -> None:
    s = score('{"name": "search_products", "arguments": {"max_price": 40.0, "color": "red", "query": " hoodie"}}', GOLD)
    assert (s.json_valid, s.name_match, s.exact_match, s.arg_f1) == (True, True, True, 1.0)


def test_argument_f1_hand_computed() -> None:
    # predicted pairs: query=hoodie (hit), color=blue (miss), size=M (extra) -> P = 1/3, R = 1/3, F1 = 1/3
    s = score('{"name": "search_products", "arguments": {"query": "hoodie", "color": "blue", "size": "M"}}', GOLD)
    assert s.name_match and not s.exact_match
    assert s.arg_precision == pytest.approx(1 / 3) and s.arg_recall == pytest.approx(1 / 3)
    assert s.arg_f1 == pytest.approx(1 / 3)
    # two of three right, nothing extra: P = 1, R = 2/3, F1 = 0.8
    s = score('{"name": "search_products", "arguments": {"query": "hoodie", "max_price": 40}}', GOLD)
    assert (s.arg_precision, s.arg_recall) == (1.0, pytest.approx(2 / 3)) and s.arg_f1 == pytest.approx(0.8)


def test_wrong_tool_scores_zero_arguments() -> None:
    s = score('{"name": "get_product", "arguments": {"query": "hoodie"}}', GOLD)
    assert (s.name_match, s.exact_match, s.arg_f1, s.predicted) == (False, False, 0.0, "get_product")


def test_abstention_cases() -> None:
    right = score('{"name": null}', {"name": None})
    assert right.exact_match and right.arg_f1 is None and right.predicted == NO_TOOL
    wrong = score('{"name": "get_order", "arguments": {"order_id": "ORD-1"}}', {"name": None})
    assert not wrong.exact_match and wrong.arg_f1 is None
    missed = score('{"name": null}', GOLD)  # abstained although a tool fits
    assert (missed.name_match, missed.arg_f1, missed.predicted) == (False, 0.0, NO_TOOL)
    broken = score("I cannot help", GOLD)
    assert (broken.json_valid, broken.predicted, broken.arg_f1) == (False, INVALID, 0.0)


def test_summary_per_tool_and_confusion_hand_computed() -> None:
    scores = [
        score('{"name": "search_products", "arguments": {"query": "hoodie", "color": "red", "max_price": 40}}', GOLD),
        score('{"name": "search_products", "arguments": {"query": "hoodie"}}', GOLD),  # F1 = 0.5
        score('{"name": null}', {"name": None}),
        score('{"name": null}', GOLD),  # false abstention
        score("garbage", {"name": "get_order", "arguments": {"order_id": "ORD-1"}}),
    ]
    s = summarize(scores)
    assert s["examples"] == 5
    assert s["json_valid"] == pytest.approx(4 / 5)
    assert s["name_accuracy"] == pytest.approx(3 / 5)
    assert s["exact_match"] == pytest.approx(2 / 5)
    assert s["arg_f1"] == pytest.approx((1.0 + 0.5 + 0.0 + 0.0) / 4)
    assert s["abstention_recall"] == 1.0 and s["abstention_precision"] == 0.5
    assert per_tool(scores)["search_products"]["exact_match"] == pytest.approx(1 / 3)
    assert confusion(scores) == {
        NO_TOOL: {NO_TOOL: 1},
        "get_order": {INVALID: 1},
        "search_products": {NO_TOOL: 1, "search_products": 2},
    }


def test_text_f1_normalizes_both_sides_and_counts_shared_tokens() -> None:
    assert text_f1("red running shoes", "Running shoes, red!") == 1.0  # order, case, punctuation ignored
    assert text_f1("ＲＥＤ shoes", "red shoes") == 1.0  # NFKC: full-width letters are letters
    assert text_f1("red shoes", "blue shoes") == pytest.approx(0.5)  # P = R = 1/2
    # pred 3 tokens, gold 2, one shared ("hoodie"): P = 1/3, R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4
    assert text_f1("black zip hoodie", "red hoodie") == pytest.approx(0.4)
    assert text_f1("", "") == 1.0 and text_f1("!?", "") == 1.0  # nothing left on either side
    assert text_f1("", "hoodie") == 0.0 and text_f1("hoodie", "") == 0.0
    assert text_f1("shoes shoes", "shoes") == pytest.approx(2 / 3)  # a bag: a repeated token counts once matched


def test_text_f1_per_example_averages_string_arguments_only() -> None:
    # string arguments: query (reworded: 1.0) and color (wrong: 0.0); max_price (a number) is left out
    s = score('{"name": "search_products", "arguments": {"query": "Hoodie!", "color": "blue", "max_price": 99}}', GOLD)
    assert not s.exact_match and s.text_f1 == pytest.approx(0.5)
    # a missing string argument scores 0: query 1.0, color missing -> 0.5
    assert score('{"name": "search_products", "arguments": {"query": "hoodie"}}', GOLD).text_f1 == pytest.approx(0.5)
    assert score('{"name": "get_product", "arguments": {"query": "hoodie"}}', GOLD).text_f1 == 0.0  # wrong tool
    assert score("garbage", GOLD).text_f1 == 0.0
    assert score('{"name": null}', {"name": None}).text_f1 is None  # abstention: no arguments to judge
    numbers_only = {"name": "get_page", "arguments": {"page": 2}}
    assert score('{"name": "get_page", "arguments": {"page": 3}}', numbers_only).text_f1 is None


def test_ids_are_exact_and_id_lists_are_sets_never_free_text() -> None:
    """tau-bench calls carry order and item ids: a near-miss id is wrong (not a 0.9 text F1), and the same
    item ids in another order are the same call."""
    gold = {
        "name": "return_delivered_order_items",
        "arguments": {"order_id": "#W6067464", "item_ids": ["9624127908", "8917609800"], "reason": "broken lid"},
    }
    swapped = score(
        '{"name":"return_delivered_order_items","arguments":{"item_ids":["8917609800","9624127908"],'
        '"order_id":"#W6067464","reason":"broken lid"}}',
        gold,
    )
    assert swapped.exact_match and swapped.arg_f1 == 1.0
    near = score(
        '{"name":"return_delivered_order_items","arguments":{"item_ids":["9624127908"],'
        '"order_id":"#W6067465","reason":"the lid is broken"}}',
        gold,
    )
    assert not near.exact_match and near.arg_f1 == 0.0
    assert near.text_f1 == pytest.approx(text_f1("the lid is broken", "broken lid")), "only `reason` is free text"
    only_ids = {"name": "get_order_details", "arguments": {"order_id": "#W1"}}
    assert score('{"name":"get_order_details","arguments":{"order_id":"#W1"}}', only_ids).text_f1 is None


def test_summary_and_per_tool_carry_text_f1() -> None:
    scores = [
        score(
            '{"name": "search_products", "arguments": {"query": "hoodie", "color": "red", "max_price": 40}}', GOLD
        ),  # 1.0
        score('{"name": "search_products", "arguments": {"query": "hoodie red", "color": "red"}}', GOLD),  # 0.833
        score('{"name": "get_page", "arguments": {"page": 3}}', {"name": "get_page", "arguments": {"page": 2}}),
        score('{"name": null}', {"name": None}),  # None: left out
    ]
    second = (2 * 0.5 * 1.0 / 1.5 + 1.0) / 2  # query: P = 1/2, R = 1 -> 2/3; color 1.0
    assert scores[1].text_f1 == pytest.approx(second)
    s = summarize(scores)
    assert s["text_f1"] == pytest.approx((1.0 + second) / 2)
    # existing keys keep their meaning: argument pairs of the second call: P = 1/2, R = 1/3 -> F1 = 0.4
    assert s["exact_match"] == pytest.approx(2 / 4) and s["arg_f1"] == pytest.approx((1.0 + 0.4 + 0.0) / 3)
    tools = per_tool(scores)
    assert tools["search_products"]["text_f1"] == pytest.approx((1.0 + second) / 2)
    assert tools["get_page"]["text_f1"] is None and tools[NO_TOOL]["text_f1"] is None


def test_text_f1_reaches_the_side_by_side_table_the_per_tool_table_and_the_gate_rows(tmp_path) -> None:
    import json

    from pipelines.evaluate.pipeline import EvalReport, score_condition
    from pipelines.evaluate.report import _per_tool_rows
    from pipelines.registry.models import evaluation_rows
    from pipelines.storage import write_json
    from pipelines.toolcall.examples import Example

    gold = json.dumps({"name": "search_products", "arguments": {"query": "red running shoes"}})
    examples = [Example(f"r{i}", [], gold, "search_products", "shoes?", "[]") for i in range(2)]
    outputs = [
        '{"name": "search_products", "arguments": {"query": "Running shoes, red!"}}',  # text F1 1.0
        '{"name": "search_products", "arguments": {"query": "red shoes"}}',
    ]  # text F1 0.8
    result = score_condition("tuned", "adapter", "short", 0, examples, outputs, {"latency_ms_p50": 5.0})
    report = EvalReport("t", "d", 2, [result])
    [table] = report.table()
    assert list(table)[:3] == ["condition", "exact_match", "text_f1"]  # next to exact match
    assert table["exact_match"] == 0.0 and table["text_f1"] == pytest.approx(0.9)
    [tool_row] = _per_tool_rows(result)
    assert tool_row["tool"] == "search_products" and tool_row["text_f1"] == pytest.approx(0.9)
    uri = write_json(str(tmp_path / "report.json"), report.to_dict())
    rows = evaluation_rows({"table": report.table(), "json_uri": uri})
    assert rows["tuned"]["per_tool"]["search_products"]["text_f1"] == pytest.approx(0.9)


RETAIL = {"cancel_pending_order": "write", "modify_pending_order_address": "write", "get_order_details": "read"}
MODIFY = {"name": "modify_pending_order_address", "arguments": {"order_id": "#W1", "city": "Austin"}}


@pytest.mark.parametrize(
    ("output", "expected", "kind"),
    [
        ('{"name":"cancel_pending_order","arguments":{"order_id":"#W1"}}', MODIFY, "wrong_tool"),
        ('{"name":"modify_pending_order_address","arguments":{"order_id":"#W2","city":"Austin"}}', MODIFY, "other_ids"),
        (
            '{"name":"cancel_pending_order","arguments":{"order_id":"#W1"}}',
            {"name": "get_order_details", "arguments": {"order_id": "#W1"}},
            "unexpected_write",
        ),
        ('{"name":"cancel_pending_order","arguments":{"order_id":"#W1"}}', {"name": None}, "unexpected_write"),
        ('{"name":"refund_everything","arguments":{}}', {"name": None}, "unexpected_write"),  # undeclared: a write
        ('{"name":"modify_pending_order_address","arguments":{"order_id":"#W1","city":"Dallas"}}', MODIFY, None),
        ('{"name":"get_order_details","arguments":{"order_id":"#W7"}}', MODIFY, None),  # a wrong read: no write
        ('{"name":null}', MODIFY, None),
        ("not a call", MODIFY, None),
    ],
)
def test_a_wrong_write_is_counted_apart_by_kind(output: str, expected: dict, kind: str | None) -> None:
    assert score(output, expected, RETAIL).wrong_write == kind


def test_wrong_writes_are_summed_split_and_named_per_condition() -> None:
    outputs = ['{"name":"cancel_pending_order","arguments":{"order_id":"#W1"}}'] * 2 + [
        '{"name":"modify_pending_order_address","arguments":{"order_id":"#W1","city":"Austin"}}',
        '{"name":"get_order_details","arguments":{"order_id":"#W1"}}',
    ]
    expected = [MODIFY, MODIFY, MODIFY, {"name": "get_order_details", "arguments": {"order_id": "#W1"}}]
    summary = summarize([score(o, e, RETAIL) for o, e in zip(outputs, expected)])
    assert summary["wrong_writes"] == 2 and summary["wrong_write_rate"] == 0.5
    assert summary["wrong_write_kinds"] == {"wrong_tool": 2, "other_ids": 0, "unexpected_write": 0}
    assert summary["wrong_write_pairs"] == {"cancel_pending_order for modify_pending_order_address": 2}
    assert summary["expected_writes"] == 3


def test_wrong_writes_reach_the_report_page_the_gate_rows_and_the_veto(tmp_path) -> None:
    import json

    from pipelines.config import load_settings
    from pipelines.evaluate.pipeline import EvalReport, score_condition
    from pipelines.evaluate.report import render_html
    from pipelines.registry.gate import gate
    from pipelines.registry.models import evaluation_rows
    from pipelines.storage import write_json
    from pipelines.toolcall.examples import Example

    gold = json.dumps(MODIFY)
    examples = [Example(f"r{i}", [], gold, "modify_pending_order_address", f"move order {i}", "[]") for i in range(2)]
    cancel = '{"name":"cancel_pending_order","arguments":{"order_id":"#W1"}}'
    right = json.dumps(MODIFY)
    stats = {"latency_ms_p50": 5.0, "prompt_tokens_mean": 80.0}
    candidate = score_condition("tuned_candidate", "a", "short", 0, examples, [cancel, right], stats, RETAIL)
    champion = score_condition("tuned_champion", "b", "short", 0, examples, [right, right], stats, RETAIL)
    assert [w["record_id"] for w in candidate.wrong_writes] == ["r0"] and candidate.wrong_writes[0][
        "kind"
    ] == "wrong_tool"
    report = EvalReport("t", "d", 2, [candidate, champion])
    page = render_html(report)
    assert "wrong writes: 1 of 2" in page and "move order 0" in page  # listed request by request
    uri = write_json(str(tmp_path / "report.json"), report.to_dict())
    rows = evaluation_rows({"table": report.table(), "json_uri": uri})
    assert rows["tuned_candidate"]["wrong_writes"] == 1 and rows["tuned_champion"]["wrong_writes"] == 0
    assert rows["tuned_candidate"]["per_tool"]["modify_pending_order_address"]["write"] is True
    verdict = gate(rows["tuned_candidate"], rows["tuned_champion"], load_settings(root=str(tmp_path)))
    assert verdict.reason == (
        "refused: wrong writes 1 of 2 vs 0 of 2 (cancel_pending_order for modify_pending_order_address)"
    )


def test_an_unreadable_toolset_registry_never_turns_an_imported_write_into_a_read(monkeypatch) -> None:
    """The live gate's write veto while storage is down: the last good read is kept; with none, a tool
    outside the catalogue counts as a write (and the registry is not re-read on every request)."""
    import pipelines.logs.toolsets as toolsets
    from pipelines.toolcall import grounding

    reads = []

    def good(raw_zone):
        """A stand-in for the toolset registry's read (`toolsets.tool_effects` on the raw zone). The real read, on
        a registered toolset, runs in
        tests/test_gateway.py::test_the_loop_trains_on_the_teacher_and_on_people_never_on_the_champion_alone."""
        reads.append(raw_zone)
        return {"cancel_pending_order": "write", "get_order_details": "read", "capture_order": "write"}

    def down(raw_zone):
        reads.append(raw_zone)
        raise OSError("storage unreachable")

    monkeypatch.setattr(grounding, "_effects_cache", {})
    monkeypatch.setattr(toolsets, "tool_effects", down)
    cold = grounding.registered_effects("s3://raw-a")
    assert isinstance(cold, grounding.UnknownEffects) and "capture_order" in cold
    judged = grounding.judged_effects(["cancel_pending_order", "get_order_details"], cold)
    assert judged["cancel_pending_order"] == "write" and judged["get_order_details"] == "write"
    grounding.registered_effects("s3://raw-a")
    assert len(reads) == 1  # the failure is remembered for a while: not one storage read per request

    monkeypatch.setattr(toolsets, "tool_effects", good)
    warm = grounding.registered_effects("s3://raw-b")
    monkeypatch.setattr(toolsets, "tool_effects", down)
    cached = grounding._effects_cache["s3://raw-b"]
    grounding._effects_cache["s3://raw-b"] = (cached[0] - 3600, cached[1])  # expired: the next call re-reads
    kept = grounding.registered_effects("s3://raw-b")
    assert kept == warm and not isinstance(kept, grounding.UnknownEffects)
    # readable registry: a tool the caller offered that nobody registered is judged a read
    assert grounding.judged_effects(["lookup_weather"], warm)["lookup_weather"] == "read"


def test_a_call_the_gateway_would_refuse_after_decoding_is_scored_as_no_call() -> None:
    """A tool the grammar enforces only in part (`uniqueItems`): an answer that breaks the whole schema is
    never passed on by the gateway, so evaluation does not count it as a call (nor as a wrong write)."""
    import json

    from pipelines.evaluate.pipeline import score_condition
    from pipelines.toolcall.examples import Example

    tools = json.dumps(
        [
            {
                "name": "tag_order",
                "parameters": {
                    "type": "object",
                    "required": ["order_id", "tags"],
                    "properties": {
                        "order_id": {"type": "string"},
                        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                    },
                },
            }
        ]
    )
    gold = json.dumps({"name": "tag_order", "arguments": {"order_id": "ORD-1", "tags": ["gift"]}})
    examples = [Example(f"r{i}", [], gold, "tag_order", "tag it", tools) for i in range(2)]
    fits = '{"name":"tag_order","arguments":{"order_id":"ORD-1","tags":["gift"]}}'
    breaks = '{"name":"tag_order","arguments":{"order_id":"ORD-2","tags":["gift","gift"]}}'  # duplicate tags
    result = score_condition("tuned", "a", "short", 0, examples, [fits, breaks], {}, {"tag_order": "write"})
    assert [r["exact_match"] for r in result.per_request] == [1, 0]
    assert result.confusion == {"tag_order": {"tag_order": 1, INVALID: 1}}
    assert result.wrong_writes == []  # refused, so never made (as a call it would be a write to other ids)


def test_scoring_as_served_admits_redaction_tokens_and_patterns_only_the_grammar_can_read() -> None:
    """Targets are redacted, so a correct answer may carry `<EMAIL>` where the grammar admits it: not a breach.
    A pattern Python's `re` cannot read (`\\p{L}`, llguidance can) is left to the grammar, and the keyword
    checked after decoding (`uniqueItems`) is still checked: never an aborted evaluation or a gateway 500."""
    import json

    from pipelines.evaluate.pipeline import as_served
    from pipelines.toolcall.calls import schema_breach

    params = {
        "type": "object",
        "required": ["email", "tags"],
        "properties": {
            "email": {"type": "string", "format": "email", "pattern": "^[^@]+@[^@]+$"},
            "name": {"type": "string", "pattern": "^\\p{L}+$"},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
    }
    tools = json.dumps([{"name": "invite", "parameters": params}])
    redacted = '{"name":"invite","arguments":{"email":"<EMAIL>","name":"Ana","tags":["vip"]}}'
    assert as_served(redacted, tools) == redacted
    assert schema_breach("invite", json.loads(redacted)["arguments"], params) == "email"  # the gateway's check
    twice = '{"name":"invite","arguments":{"email":"a@b.c","name":"Ana","tags":["vip","vip"]}}'
    assert as_served(twice, tools) == ""
    assert schema_breach("invite", json.loads(twice)["arguments"], params) == "tags"
