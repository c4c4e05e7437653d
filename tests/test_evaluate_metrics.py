"""Function-calling metrics against hand-computed cases."""

from __future__ import annotations

import pytest

from pipelines.evaluate.metrics import INVALID, NO_TOOL, confusion, parse_call, per_tool, score, summarize

GOLD = {"name": "search_products", "arguments": {"query": "hoodie", "color": "red", "max_price": 40}}


def test_parse_call_finds_the_call_in_surrounding_text() -> None:
    assert parse_call('Sure! {"name": "get_order", "arguments": {"order_id": "ORD-1"}} done') == {
        "name": "get_order", "arguments": {"order_id": "ORD-1"}}
    assert parse_call('{"name": null}') == {"name": None, "arguments": {}}
    assert parse_call('{"name": "get_order", "arguments": "{\\"order_id\\": \\"X\\"}"}')["arguments"] == {
        "order_id": "X"}
    for bad in ("no json here", '{"order_id": 1}', '{"name": 3}', '{"name": "x", "arguments": [1]}', "{broken"):
        assert parse_call(bad) is None


def test_exact_match_compares_values_as_json() -> None:
    s = score('{"name": "search_products", "arguments": {"max_price": 40.0, "color": "red", "query": " hoodie"}}',
              GOLD)
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
        score('{"name": "search_products", "arguments": {"query": "hoodie"}}', GOLD),   # F1 = 0.5
        score('{"name": null}', {"name": None}),
        score('{"name": null}', GOLD),                                                 # false abstention
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
    assert confusion(scores) == {NO_TOOL: {NO_TOOL: 1}, "get_order": {INVALID: 1},
                                 "search_products": {NO_TOOL: 1, "search_products": 2}}
