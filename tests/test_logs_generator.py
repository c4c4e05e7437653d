from __future__ import annotations

import hashlib
import re
from collections import Counter
from datetime import date
from pathlib import Path

import orjson
import pytest

from pipelines.logs.raw import check_files, iter_lines, raw_files
from pipelines.logs.schema import check_line, teacher_call
from pipelines.logs.tools import TOOL_WORKLOAD
from pipelines.simulate.generator import (
    BAD_KINDS,
    EXPECTED_REASON,
    Drift,
    GeneratorConfig,
    Kind,
    TrafficGenerator,
    luhn_complete,
    luhn_valid,
    write_raw_logs,
)

END = date(2026, 11, 20)


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.jsonl*"))
    }


def _records(cfg: GeneratorConfig) -> list[tuple[Kind, bytes]]:
    return [(kind, line) for _, line, kind in TrafficGenerator(cfg).lines()]


@pytest.mark.parametrize("compress", [False, True])
def test_same_seed_gives_byte_identical_files(tmp_path: Path, compress: bool) -> None:
    cfg = GeneratorConfig(seed=42, records=3000, days=3, end_date=END, bad_share=0.1)
    write_raw_logs(cfg, tmp_path / "a", compress=compress)
    write_raw_logs(cfg, tmp_path / "b", compress=compress)
    a, b = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert a == b and len(a) == 3
    write_raw_logs(GeneratorConfig(seed=43, records=3000, days=3, end_date=END), tmp_path / "c", compress=compress)
    assert set(_digest(tmp_path / "c").values()).isdisjoint(a.values())


def test_rerun_replaces_its_own_partition_files(tmp_path: Path) -> None:
    cfg = GeneratorConfig(seed=1, records=500, days=2, end_date=END)
    first = write_raw_logs(cfg, tmp_path)
    second = write_raw_logs(cfg, tmp_path)
    assert first.files == second.files
    assert sum(1 for f in raw_files(tmp_path) for _ in iter_lines(f)) == 500
    assert not list(tmp_path.rglob(".*.tmp"))


def test_records_are_spread_over_days_in_time_order(tmp_path: Path) -> None:
    summary = write_raw_logs(GeneratorConfig(seed=2, records=1000, days=4, end_date=END, bad_share=0), tmp_path)
    assert summary.days == {"2026-11-17": 250, "2026-11-18": 250, "2026-11-19": 250, "2026-11-20": 250}
    for path in raw_files(tmp_path):
        day = path.parent.name[3:]
        stamps = [orjson.loads(line)["timestamp"] for line in iter_lines(path)]
        assert all(s.startswith(day) for s in stamps)
        assert stamps == sorted(stamps)


@pytest.mark.parametrize("share", [0.0, 0.1, 0.3])
def test_bad_share_is_honoured_and_every_kind_gets_its_verdict(share: float) -> None:
    n = 8000
    records = _records(GeneratorConfig(seed=9, records=n, end_date=END, bad_share=share))
    kinds = Counter(kind for kind, _ in records)
    assert sum(kinds.values()) == n
    bad = n - kinds[Kind.GOOD]
    assert abs(bad / n - share) < 0.02
    if share:
        assert set(BAD_KINDS) <= set(kinds), "every bad kind appears"
    for kind, line in records:
        verdict = check_line(line)
        assert verdict.reason == EXPECTED_REASON[kind], (kind, verdict)


def test_duplicates_repeat_an_earlier_request() -> None:
    records = _records(GeneratorConfig(seed=4, records=4000, end_date=END, bad_share=0.3))
    seen_lines, seen_texts = set(), set()
    for kind, line in records:
        if kind is Kind.EXACT_DUPLICATE:
            assert line in seen_lines
        if kind is Kind.NEAR_DUPLICATE:
            text = orjson.loads(line)["request"]["messages"][-1]["content"]
            assert _norm(text) in seen_texts
        if kind is Kind.GOOD:
            seen_lines.add(line)
            seen_texts.add(_norm(orjson.loads(line)["request"]["messages"][-1]["content"]))


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip("!?. ")


def test_traffic_is_realistic() -> None:
    records = [
        orjson.loads(line) for kind, line in _records(GeneratorConfig(seed=5, records=6000, end_date=END, bad_share=0))
    ]
    tools = Counter((teacher_call(r) or {"name": None})["name"] for r in records)
    assert len(tools) == 16 and tools[None] > 0, "all 15 tools and abstentions occur"
    assert max(r["turn_index"] for r in records) >= 2, "multi-turn sessions"
    for r in records:  # history: every earlier user turn, and a tool result after each earlier tool call
        roles = [m["role"] for m in r["request"]["messages"]]
        assert roles[0] == "system" and roles.count("user") == r["turn_index"] + 1
        calls = sum(1 for m in r["request"]["messages"] if m["role"] == "assistant" and m.get("tool_calls"))
        assert roles.count("tool") == calls
    texts = [r["request"]["messages"][-1]["content"] for r in records]
    assert len(set(texts)) > 0.8 * len(texts), "many phrasings"
    assert sum("@" in t for t in texts) > 30, "emails in free text"
    cards = [m.group(0) for t in texts for m in re.finditer(r"\b(?:\d[ -]?){15}\d\b", t)]
    assert len(cards) > 30 and all(luhn_valid(c) for c in cards), "Luhn-valid card numbers"
    assert sum(bool(re.search(r"\d+ \w+ (Street|Avenue|Drive|Road|Lane|Boulevard|Court)", t)) for t in texts) > 30
    for r in records:
        call = teacher_call(r)
        if call:
            assert r["workload_id"] in TOOL_WORKLOAD[call["name"]] or call["name"] in str(r["request"]["tools"])
        assert r["currency"] in {"USD", "GBP", "CAD", "AUD", "EUR", "MXN", "INR"}
    searches = [
        teacher_call(r)["arguments"] for r in records if (teacher_call(r) or {}).get("name") == "search_products"
    ]
    assert {"brand", "color", "max_price", "min_price", "size", "limit"} <= {k for a in searches for k in a}


def test_luhn() -> None:
    assert luhn_complete("7992739871") == "79927398713"
    assert luhn_valid("4539 1488 0343 6467") and not luhn_valid("4539 1488 0343 6468")


def _share(records: list[dict], predicate) -> float:
    return sum(1 for r in records if predicate(r)) / len(records)


@pytest.fixture(scope="module")
def baseline() -> list[dict]:
    return [
        orjson.loads(line) for _, line in _records(GeneratorConfig(seed=21, records=5000, end_date=END, bad_share=0))
    ]


def _drifted(kind: Drift, magnitude: float = 0.8) -> list[dict]:
    cfg = GeneratorConfig(seed=21, records=5000, end_date=END, bad_share=0, drift=kind, drift_magnitude=magnitude)
    return [orjson.loads(line) for _, line in _records(cfg)]


def _text(r: dict) -> str:
    return r["request"]["messages"][-1]["content"].lower()


def test_holiday_drift_brings_gift_queries(baseline: list[dict]) -> None:
    gift = lambda r: any(w in _text(r) for w in ("gift", "christmas", "holiday", "santa", "stocking"))  # noqa: E731
    assert _share(baseline, gift) < 0.01
    assert _share(_drifted(Drift.HOLIDAY), gift) > 0.15
    assert _share(_drifted(Drift.HOLIDAY, 0.2), gift) < _share(_drifted(Drift.HOLIDAY, 0.8), gift)


def test_new_category_drift_adds_unseen_categories(baseline: list[dict]) -> None:
    def new(r: dict) -> bool:
        call = teacher_call(r)
        return bool(call) and call["arguments"].get("category") in ("pet_supplies", "garden")

    assert _share(baseline, new) == 0
    assert _share(_drifted(Drift.NEW_CATEGORY), new) > 0.05


def test_locale_drift_opens_new_markets(baseline: list[dict]) -> None:
    new_market = lambda r: r["country"] in ("JP", "BR", "ES")  # noqa: E731
    assert _share(baseline, new_market) == 0
    assert _share(_drifted(Drift.LOCALE), new_market) > 0.6


def test_tool_mix_drift_shifts_workloads(baseline: list[dict]) -> None:
    disputes = lambda r: r["workload_id"] in ("disputes", "subscriptions")  # noqa: E731
    assert _share(_drifted(Drift.TOOL_MIX), disputes) > 2 * _share(baseline, disputes)


def test_check_files_counts_every_line(tmp_path: Path) -> None:
    summary = write_raw_logs(
        GeneratorConfig(seed=8, records=3000, days=2, end_date=END, bad_share=0.2), tmp_path, compress=True
    )
    check = check_files(raw_files(tmp_path))
    assert check.lines == summary.records == 3000
    assert check.valid + sum(check.reasons.values()) == check.lines
    expected_bad = sum(n for k, n in summary.kinds.items() if EXPECTED_REASON[Kind(k)] is not None)
    assert sum(check.reasons.values()) == expected_bad


def test_invalid_generator_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="bad_share"):
        GeneratorConfig(bad_share=1.5)
    with pytest.raises(ValueError, match="days"):
        GeneratorConfig(days=0)


def _call(r: dict) -> tuple[str, dict] | None:
    calls = r["response"]["choices"][0]["message"].get("tool_calls")
    if not calls:
        return None
    return calls[0]["function"]["name"], orjson.loads(calls[0]["function"]["arguments"])


def test_an_injected_slip_is_systematic_rated_as_told_and_its_truth_kept_apart(baseline: list[dict]) -> None:
    """A slip (issue 51's acceptance): the slip's share of get_order turns, asked in its own phrasings, logged as
    track_shipment with the same order id; only those rated down (never up), the other answers only rated up;
    `truth` writes the same phrasings with the right call. Mutations tried: the wrong tool not applied; the
    ratings left as the plain generator's (random downs): each fails."""
    from pipelines.simulate.generator import Slip
    from pipelines.simulate.generator.config import SLIP_PHRASES

    def run(truth: bool) -> list[dict]:
        cfg = GeneratorConfig(seed=21, records=5000, end_date=END, bad_share=0, slip=Slip(share=0.3, truth=truth))
        return [orjson.loads(line) for _, line in _records(cfg)]

    logged, truth = run(False), run(True)
    slipped = [r for r in logged if r.get("scenario") == "slip"]
    asked = [r for r in logged if _call(r) and _call(r)[0] == "get_order"] + slipped
    assert 0.2 < len(slipped) / len(asked) < 0.4
    assert all(" my order {order_id}" in p for p in SLIP_PHRASES["get_order"])  # "my" survives a typo (2 letters)
    for r in slipped:
        name, args = _call(r)
        assert name == "track_shipment" and set(args) == {"order_id"} and args["order_id"] in _text(r).upper()
        assert " my " in _text(r) and r["feedback"] in ("down", "none")
    assert not any(_text(r).startswith(("where's my order", "any news on my order")) for r in baseline)
    down = sum(r["feedback"] == "down" for r in slipped) / len(slipped)
    assert 0.1 < down < 0.3
    rest = [r for r in logged if r.get("scenario") != "slip"]
    assert {r["feedback"] for r in rest} == {"up", "none"} and 0.15 < _share(
        rest, lambda r: r["feedback"] == "up"
    ) < 0.25
    right = [r for r in truth if r.get("scenario") == "slip"]
    assert right and all(_call(r)[0] == "get_order" for r in right)
    with pytest.raises(ValueError, match="takes no order_id"):
        Slip(intent="get_order", wrong="list_invoices")
    with pytest.raises(ValueError, match="INTENT:WRONG"):
        Slip.parse("get_order")
    assert Slip.parse("get_order:track_shipment:0.5", truth=True) == Slip(share=0.5, truth=True)
