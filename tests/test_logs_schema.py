from __future__ import annotations

import copy
import itertools
import json
from datetime import date
from pathlib import Path

import jsonschema
import orjson
import pytest

from pipelines.logs.schema import SCHEMA_FILE, Reason, check_line, json_schema, teacher_call
from pipelines.logs.tools import TOOL_NAMES, TOOLS, argument_errors
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator


@pytest.fixture(scope="module")
def good_record() -> dict:
    gen = TrafficGenerator(GeneratorConfig(seed=11, records=50, bad_share=0.0, end_date=date(2026, 11, 1)))
    for _, line, _ in gen.lines():
        record = orjson.loads(line)
        if teacher_call(record) is not None:
            return record
    raise AssertionError("no tool call generated")


def test_committed_json_schema_matches_the_model() -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema(), "run `flywheel logs schema --write`"


def test_json_schema_file_accepts_generated_good_records() -> None:
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    gen = TrafficGenerator(GeneratorConfig(seed=3, records=200, bad_share=0.0, end_date=date(2026, 11, 1)))
    for _, line, _ in gen.lines():
        assert not list(validator.iter_errors(orjson.loads(line)))


def test_every_tool_has_a_strict_openai_function_schema() -> None:
    assert len(TOOL_NAMES) == 15 and len(set(TOOL_NAMES)) == 15
    for tool in TOOLS:
        params = tool["function"]["parameters"]
        jsonschema.Draft202012Validator.check_schema(params)
        assert params["additionalProperties"] is False
        assert set(params["required"]) <= set(params["properties"])


def test_argument_errors_explain_what_is_wrong() -> None:
    assert argument_errors("get_order", {"order_id": "ORD-0000000001"}) == []
    assert "required" in argument_errors("get_order", {})[0]
    assert "debug" in argument_errors("get_order", {"order_id": "ORD-0000000001", "debug": 1})[0]
    assert argument_errors("refund_all", {}) == ["unknown tool 'refund_all'"]


def _mutated(record: dict, mutate) -> bytes:
    twin = copy.deepcopy(record)
    mutate(twin)
    return orjson.dumps(twin)


def _set_call(name: str, arguments: str):
    def mutate(r: dict) -> None:
        r["response"]["choices"][0]["message"]["tool_calls"][0]["function"].update(name=name, arguments=arguments)

    return mutate


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda r: r.pop("customer_id"), Reason.SCHEMA_VIOLATION),
        (lambda r: r.update(latency_ms="slow"), Reason.SCHEMA_VIOLATION),
        (lambda r: r.update(workload_id="marketing"), Reason.SCHEMA_VIOLATION),
        (lambda r: r.update(timestamp="yesterday"), Reason.SCHEMA_VIOLATION),
        (lambda r: r["request"].update(messages=[]), Reason.SCHEMA_VIOLATION),
        (_set_call("teleport", "{}"), Reason.UNKNOWN_TOOL),
        (_set_call("get_dispute", '{"dispute_id": "PP-D-1234567"}'), Reason.UNKNOWN_TOOL),  # not offered
        (lambda r: r.update(latency_ms=-5.0), Reason.IMPOSSIBLE_VALUE),
        (lambda r: r.update(latency_ms=10_000_000.0), Reason.IMPOSSIBLE_VALUE),
        (lambda r: r.update(retrieval_latency_ms=r["latency_ms"] + 1), Reason.IMPOSSIBLE_VALUE),
    ],
)
def test_check_line_names_the_reason(good_record: dict, mutate, reason: Reason) -> None:
    assert check_line(orjson.dumps(good_record)).ok
    verdict = check_line(_mutated(good_record, mutate))
    assert verdict.reason is reason, verdict.detail
    assert verdict.detail


def test_invalid_arguments_are_caught(good_record: dict) -> None:
    name = teacher_call(good_record)["name"]
    for arguments in ("{not json", '{"surprise": true}'):
        verdict = check_line(_mutated(good_record, _set_call(name, arguments)))
        assert verdict.reason is Reason.INVALID_ARGUMENTS
        assert name in verdict.detail


@pytest.mark.parametrize("line", [b"", b"{", b"[1, 2]", b"null", b'"text"', b"\xff\xfe"])
def test_garbage_is_bad_json(line: bytes) -> None:
    assert check_line(line).reason is Reason.BAD_JSON


def test_abstention_is_a_valid_turn() -> None:
    gen = TrafficGenerator(GeneratorConfig(seed=5, records=2000, bad_share=0.0, end_date=date(2026, 11, 1)))
    abstained = [
        orjson.loads(line) for _, line, _k in itertools.islice(gen.lines(), 2000) if b'"finish_reason":"stop"' in line
    ]
    assert abstained, "the generator must produce turns where no tool fits"
    assert all(check_line(orjson.dumps(r)).ok and teacher_call(r) is None for r in abstained)


def test_webshop_importer_writes_valid_search_turns(tmp_path) -> None:
    from pipelines.logs.raw import check_files, raw_files
    from pipelines.simulate.importers import webshop_to_raw

    pairs = tmp_path / "pairs.json"
    pairs.write_text(
        json.dumps(
            {
                "i need a red hoodie under 40 dollars": ["red hoodie", "hoodie red"],
                "looking for gluten free granola bars": ["gluten free granola"],
            }
        )
    )
    result = webshop_to_raw(pairs, tmp_path / "raw", date(2026, 10, 1))
    assert result == {
        "instructions": 2,
        "records": 3,
        "import_id": result["import_id"],
        "file": str(tmp_path / f"raw/dt=2026-10-01/webshop-{result['import_id']}.jsonl"),
    }
    check = check_files(raw_files(tmp_path / "raw"))
    assert (check.lines, check.valid) == (3, 3)
    lines = Path(result["file"]).read_bytes().splitlines()
    calls = [teacher_call(orjson.loads(line)) for line in lines]
    assert {c["arguments"]["query"] for c in calls} == {"red hoodie", "hoodie red", "gluten free granola"}
    assert {c["name"] for c in calls} == {"search_products"}


RETAIL_LIKE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "cancel_pending_order",
            "description": "Cancel a pending order.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "reason": {"type": "string", "enum": ["no longer needed"]},
                },
                "required": ["order_id", "reason"],
            },
        },
    }
]


def test_retail_importer_registers_its_toolset_and_validates_against_it(tmp_path) -> None:
    from pipelines.logs.tools import catalogue
    from pipelines.logs.toolsets import load_extra_tools
    from pipelines.simulate.importers import retail_to_raw

    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(RETAIL_LIKE_TOOLS))
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "instruction": "Cancel #W1 because I no longer need it.",
                    "actions": [
                        {"name": "think", "arguments": {"thought": "..."}},
                        {
                            "name": "cancel_pending_order",
                            "arguments": {"order_id": "#W1", "reason": "no longer needed"},
                        },
                    ],
                },
                {
                    "instruction": "Cancel #W2 and #W3.",
                    "actions": [
                        {
                            "name": "cancel_pending_order",
                            "arguments": {"order_id": "#W2", "reason": "no longer needed"},
                        },
                        {"name": "cancel_pending_order", "arguments": {"order_id": "#W3", "reason": "too slow"}},
                    ],
                },
            ]
        )
    )
    result = retail_to_raw(tools_file, tasks_file, tmp_path / "raw", date(2026, 10, 2))
    assert (result["tasks"], result["records"]) == (2, 3)
    assert load_extra_tools(str(tmp_path / "raw")) == RETAIL_LIKE_TOOLS
    tools = catalogue(load_extra_tools(str(tmp_path / "raw")))
    lines = Path(result["file"]).read_bytes().splitlines()
    verdicts = [check_line(line, tools) for line in lines]
    assert [v.reason for v in verdicts] == [None, None, Reason.INVALID_ARGUMENTS]  # "too slow" is not in the enum
    assert all(check_line(line).reason is Reason.UNKNOWN_TOOL for line in lines), "unknown without the toolset"
    second = orjson.loads(lines[1])
    assert [m["role"] for m in second["request"]["messages"]] == ["system", "user"]
    assert teacher_call(orjson.loads(lines[2]))["arguments"]["order_id"] == "#W3"
    assert [m["role"] for m in orjson.loads(lines[2])["request"]["messages"]] == ["system", "user", "assistant", "tool"]


def _tool(name: str, *args: str, items: tuple[str, ...] = ()) -> dict:
    props = {a: {"type": "string"} for a in args} | {a: {"type": "array", "items": {"type": "string"}} for a in items}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": props, "required": [*args, *items]}},
    }


RETAIL_AGENT_TOOLS = [
    _tool("find_user_id_by_email", "email"),
    _tool("find_user_id_by_name_zip", "first_name", "last_name", "zip"),
    _tool("get_user_details", "user_id"),
    _tool("get_order_details", "order_id"),
    _tool("get_product_details", "product_id"),
    _tool("cancel_pending_order", "order_id", "reason"),
    _tool("exchange_delivered_order_items", "order_id", "payment_method_id", items=("item_ids", "new_item_ids")),
]


def test_retail_trajectory_reads_before_it_writes_and_shows_each_write_applied(tmp_path) -> None:
    """tau-bench lists only the writes; the import runs the task as a policy-following agent does, answered
    from db.json: identify, profile, order, the product whose variant changes, then the write whose result
    is the database after it."""
    from pipelines.simulate.importers import UNRECORDED, retail_to_raw

    tools_file, tasks_file, db_file = tmp_path / "tools.json", tmp_path / "tasks.jsonl", tmp_path / "db.json"
    tools_file.write_text(json.dumps(RETAIL_AGENT_TOOLS))
    tasks_file.write_text(
        "\n".join(
            json.dumps(t)
            for t in [
                {
                    "user_id": "ann_1",
                    "instruction": "Your email is ann@example.com. Exchange the red kettle in #W1 for "
                    "the blue one, then cancel #W2.",
                    "actions": [
                        {
                            "name": "exchange_delivered_order_items",
                            "arguments": {
                                "order_id": "#W1",
                                "item_ids": ["111"],
                                "new_item_ids": ["112"],
                                "payment_method_id": "card_1",
                            },
                        },
                        {
                            "name": "cancel_pending_order",
                            "arguments": {"order_id": "#W2", "reason": "no longer needed"},
                        },
                    ],
                },
                {
                    "user_id": "bob_2",
                    "instruction": "Your name is Bob Ray and your zip code is 10001. Cancel #W9.",
                    "actions": [
                        {
                            "name": "cancel_pending_order",
                            "arguments": {"order_id": "#W9", "reason": "ordered by mistake"},
                        }
                    ],
                },
            ]
        )
    )
    kettle = {
        "name": "Kettle",
        "product_id": "9",
        "variants": {
            "111": {"item_id": "111", "options": {"color": "red"}, "available": True, "price": 5.0},
            "112": {"item_id": "112", "options": {"color": "blue"}, "available": True, "price": 6.0},
        },
    }
    order = {
        "order_id": "#W1",
        "status": "delivered",
        "user_id": "ann_1",
        "address": {"city": "X"},
        "items": [{"name": "Kettle", "item_id": "111", "product_id": "9", "price": 5.0, "options": {"color": "red"}}],
        "payment_history": [{"payment_method_id": "card_1", "amount": 5.0}],
    }
    users = {
        "ann_1": {
            "user_id": "ann_1",
            "name": {"first_name": "Ann", "last_name": "Lee"},
            "email": "ann@example.com",
            "address": {"zip": "94105"},
            "payment_methods": {"card_1": {"source": "credit_card"}},
            "orders": ["#W1", "#W2"],
        },
        "bob_2": {
            "user_id": "bob_2",
            "name": {"first_name": "Bob", "last_name": "Ray"},
            "email": "b@example.com",
            "address": {"zip": "10001"},
            "payment_methods": {},
            "orders": ["#W9"],
        },
    }
    db = {
        "orders": {
            "#W1": order,
            "#W2": {**order, "order_id": "#W2", "status": "pending"},
            "#W9": {**order, "order_id": "#W9", "status": "pending", "user_id": "bob_2"},
        },
        "users": users,
        "products": {"9": kettle},
    }
    db_file.write_text(json.dumps(db))
    result = retail_to_raw(tools_file, tasks_file, tmp_path / "raw", date(2026, 10, 2), db_file=db_file)
    assert json.loads(db_file.read_text()) == db, "the database file is never written"
    assert (result["reads"], result["writes"], result["results_not_recorded"]) == (8, 3, 0)
    lines = [orjson.loads(x) for x in Path(result["file"]).read_bytes().splitlines()]
    assert [teacher_call(r)["name"] for r in lines] == [
        "find_user_id_by_email",
        "get_user_details",
        "get_order_details",
        "get_product_details",
        "exchange_delivered_order_items",
        "get_order_details",
        "cancel_pending_order",
        "find_user_id_by_name_zip",
        "get_user_details",
        "get_order_details",
        "cancel_pending_order",
    ]
    assert teacher_call(lines[0])["arguments"] == {"email": "ann@example.com"}
    assert teacher_call(lines[7])["arguments"] == {"first_name": "Bob", "last_name": "Ray", "zip": "10001"}
    results = [m["content"] for m in lines[6]["request"]["messages"] if m["role"] == "tool"]
    assert results[0] == "ann_1" and json.loads(results[1])["orders"] == ["#W1", "#W2"]
    assert json.loads(results[2])["status"] == "delivered"
    assert json.loads(results[3])["variants"]["112"].startswith("color blue, available")
    applied = json.loads(results[4])  # the exchange as the database holds it after the write
    assert (applied["status"], applied["exchange_items"], applied["exchange_new_items"]) == (
        "exchange requested",
        ["111"],
        ["112"],
    )
    assert json.loads(results[5])["status"] == "pending", "#W2 read from the database as shipped"
    # each task starts from the database as shipped: bob's #W9 was never touched by ann's task
    assert (
        json.loads([m["content"] for m in lines[10]["request"]["messages"] if m["role"] == "tool"][-1])["status"]
        == "pending"
    )
    assert UNRECORDED not in {m.get("content") for r in lines for m in r["request"]["messages"]}
    # without the database only the writes remain, and their results say they were not recorded
    plain = retail_to_raw(tools_file, tasks_file, tmp_path / "raw2", date(2026, 10, 2))
    assert (plain["records"], plain["reads"], plain["results_not_recorded"]) == (3, 0, 3)


def test_a_toolset_may_not_redefine_catalogue_tools(tmp_path) -> None:
    from pipelines.logs.toolsets import register_toolset

    with pytest.raises(ValueError, match="redefines catalogue tools: get_order"):
        register_toolset(
            str(tmp_path),
            "evil",
            [{"type": "function", "function": {"name": "get_order", "parameters": {"type": "object"}}}],
        )


def test_every_tool_declares_its_effect_and_an_undeclared_import_is_a_write(tmp_path) -> None:
    """`flywheel tools list --json`: the catalogue and an imported toolset, each tool read or write; a tool the
    import cannot place is registered as a write (fail safe) and the import says so."""
    from helpers import run_flywheel

    from pipelines.simulate.importers import retail_to_raw

    lookup = {
        "type": "function",
        "function": {
            "name": "get_order_details",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    }
    unknown = {
        "type": "function",
        "function": {
            "name": "teleport_order",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
    tools_file, tasks_file = tmp_path / "tools.json", tmp_path / "tasks.jsonl"
    tagged = {
        "type": "function",
        "function": {
            "name": "list_all_product_types",
            "parameters": {
                "type": "object",
                "properties": {"kinds": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            },
        },
    }
    tools_file.write_text(json.dumps([*RETAIL_LIKE_TOOLS, lookup, unknown, tagged]))
    tasks_file.write_text(
        json.dumps(
            {
                "instruction": "Cancel #W1.",
                "actions": [
                    {"name": "cancel_pending_order", "arguments": {"order_id": "#W1", "reason": "no longer needed"}}
                ],
            }
        )
    )
    result = retail_to_raw(tools_file, tasks_file, tmp_path / "fw" / "raw", date(2026, 10, 2))
    assert result["undeclared_tools_treated_as_writes"] == ["teleport_order"]
    listed = run_flywheel("tools", "list", "--json", env={"FLYWHEEL_ROOT": str(tmp_path / "fw")})
    assert listed.returncode == 0, listed.stderr
    rows = {r["tool"]: r for r in json.loads(listed.stdout)["tools"]}
    assert {t: rows[t]["effect"] for t in ("cancel_pending_order", "get_order_details", "teleport_order")} == {
        "cancel_pending_order": "write",
        "get_order_details": "read",
        "teleport_order": "write",
    }
    assert rows["cancel_pending_order"]["toolset"] == "retail" and rows["cancel_pending_order"]["id_arguments"] == [
        "order_id"
    ]
    # a keyword the grammar lacks: that tool is constrained in part, and says which check waits for decoding
    assert rows["list_all_product_types"]["constrained"] == "partly (checked after decoding: uniqueItems)"
    assert rows["cancel_pending_order"]["constrained"] == "fully"
    writes = {t for t, r in rows.items() if r["toolset"] == "catalogue" and r["effect"] == "write"}
    assert writes == {
        "create_order",
        "capture_order",
        "create_invoice",
        "send_invoice",
        "create_subscription",
        "cancel_subscription",
    }
    assert all(r["effect"] in ("read", "write") for r in rows.values())


def test_a_second_import_for_the_same_day_appends_with_its_own_ids_and_a_repeat_doubles_nothing(tmp_path) -> None:
    from pipelines.logs.raw import check_files, raw_files
    from pipelines.simulate.importers import webshop_to_raw

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"i need a red hoodie": ["red hoodie"]}))
    second.write_text(json.dumps({"gluten free granola please": ["granola gluten free", "granola"]}))
    day, raw = date(2026, 10, 1), tmp_path / "raw"
    one, two = webshop_to_raw(first, raw, day), webshop_to_raw(second, raw, day)
    assert one["file"] != two["file"] and Path(one["file"]).is_file() and Path(two["file"]).is_file()
    ids = [orjson.loads(x)["record_id"] for f in (one["file"], two["file"]) for x in Path(f).read_bytes().splitlines()]
    assert len(ids) == len(set(ids)) == 3  # no id of one import collides with another's
    again = webshop_to_raw(first, raw, day)  # a retry of the same import: the same file, nothing doubled
    assert again == one and check_files(raw_files(raw)).lines == 3
