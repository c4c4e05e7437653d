"""Builds small raw windows with planted records for the data-path tests."""

from __future__ import annotations

import copy
from datetime import date
from pathlib import Path

import orjson

from pipelines.logs.schema import teacher_call
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator, write_raw_logs

END = date(2026, 11, 20)
PLANTED_PII = {
    "EMAIL": "planted.person@example-mail.com",
    "PHONE": "+1 212-555-0199",
    "CARD": "4242 4242 4242 4242",
    "ADDRESS": "742 Evergreen Terrace, Springfield",
}


def good_records(seed: int, n: int = 400) -> list[dict]:
    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=n, bad_share=0.0, end_date=END))
    return [orjson.loads(line) for _, line, _ in gen.lines()]


def planted_lines(seed: int = 99) -> tuple[list[bytes], dict[str, str]]:
    """One record per PII type (text + arguments) and one malformed line per reason; id -> expected reason."""
    records = good_records(seed)
    invoice = next(r for r in records if (teacher_call(r) or {}).get("name") == "create_invoice")
    order = next(r for r in records if (teacher_call(r) or {}).get("name") == "get_order")
    lines: list[bytes] = []
    expected: dict[str, str] = {}

    def add(record: dict, record_id: str, reason: str | None) -> None:
        record["record_id"] = record_id
        lines.append(orjson.dumps(record))
        expected[record_id] = reason or "clean"

    pii = copy.deepcopy(invoice)
    pii["request"]["messages"][-1]["content"] = (
        f"invoice {PLANTED_PII['EMAIL']} for 120 USD, call {PLANTED_PII['PHONE']}, my card is "
        f"{PLANTED_PII['CARD']}, ship to {PLANTED_PII['ADDRESS']}"
    )
    call = pii["response"]["choices"][0]["message"]["tool_calls"][0]["function"]
    call["arguments"] = orjson.dumps(
        {
            **orjson.loads(call["arguments"]),
            "recipient_email": PLANTED_PII["EMAIL"],
            "description": f"deliver to {PLANTED_PII['ADDRESS']}",
        }
    ).decode()
    add(pii, "planted_pii", None)

    missing = copy.deepcopy(order)
    del missing["customer_id"]
    add(missing, "planted_missing", "schema_violation")
    wrong = copy.deepcopy(order)
    wrong["latency_ms"] = "slow"
    add(wrong, "planted_wrong_type", "schema_violation")
    unknown = copy.deepcopy(order)
    unknown["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] = "refund_everything"
    add(unknown, "planted_unknown_tool", "unknown_tool")
    bad_args = copy.deepcopy(order)
    bad_args["response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = '{"order_id": 5}'
    add(bad_args, "planted_bad_args", "invalid_arguments")
    slow = copy.deepcopy(order)
    slow["latency_ms"] = -3.0
    add(slow, "planted_impossible", "impossible_value")
    twin = copy.deepcopy(order)
    add(twin, "planted_original", None)
    dup = copy.deepcopy(order)
    dup["request"]["messages"][-1]["content"] = "  " + dup["request"]["messages"][-1]["content"].upper() + " "
    dup["timestamp"] = dup["timestamp"][:-4] + "999Z"
    add(dup, "planted_near_duplicate", "duplicate")
    lines.append(b'{"record_id": "planted_bad_json", "request": {')
    expected["planted_bad_json"] = "bad_json"
    return lines, expected


def write_window(raw: Path, *, records: int = 3000, days: int = 3, bad_share: float = 0.1, seed: int = 17) -> dict:
    summary = write_raw_logs(
        GeneratorConfig(seed=seed, records=records, days=days, end_date=END, bad_share=bad_share), raw
    )
    lines, expected = planted_lines()
    (raw / f"dt={END.isoformat()}" / "planted.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return {"summary": summary, "planted": expected, "planted_lines": len(lines)}
