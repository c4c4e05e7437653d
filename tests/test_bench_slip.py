"""bench/slip.py's verdict (issue 51's acceptance) and its rendering on the quality page, on a made-up evaluation
whose answer is known."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from test_docs_results import rows_of, write

from docs.generate.results import render

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_slip", ROOT / "bench" / "slip.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOLS = ("search_products", "get_product", "list_invoices", "get_dispute")


def _condition(
    name: str, slip_right: int, other_wrong: int, wrong_writes: int = 0, others: int = 400
) -> dict[str, Any]:
    """20 slip requests (the first `slip_right` named right) and `others` over four tools (the first
    `other_wrong` wrong, the first `wrong_writes` of them a wrong write)."""
    rows = [{"record_id": f"s{i:03d}", "tool": "get_order", "name_match": int(i < slip_right),
             "exact_match": int(i < slip_right), "wrong_write": None} for i in range(20)]  # fmt: skip
    rows += [{"record_id": f"o{i:03d}", "tool": TOOLS[i % 4], "name_match": 1, "exact_match": int(i >= other_wrong),
              "wrong_write": "wrong_tool" if i < wrong_writes else None} for i in range(others)]  # fmt: skip
    return {"condition": f"tuned_{name}_constrained", "per_request": rows}


def test_the_slip_verdict_pairs_each_arm_and_applies_the_acceptance_rule(tmp_path: Path) -> None:
    """Mutations tried: the non-inferiority bound read from `high` (kto, 10 points worse elsewhere, passes) and
    wrong writes not compared (grpo passes): each fails."""
    bench = _bench()
    report = {
        "conditions": [
            _condition("v1", 2, 0),  # the policy's SFT: 2 of 20 slips right
            _condition("imitation", 0, 0),
            _condition("dpo", 19, 0),  # fixes the slip, the others exactly as imitation's
            _condition("kto", 19, 40),  # fixes the slip, 10 points worse elsewhere
            _condition("grpo", 19, 0, wrong_writes=0),
        ]
    }
    report["conditions"][4]["per_request"][25]["wrong_write"] = "wrong_tool"  # grpo: one wrong write more
    slips = {f"s{i:03d}": True for i in range(20)} | {f"o{i:03d}": False for i in range(400)}
    found = bench.verdict(report, slips)
    arms = found["arms"]
    assert arms["sft"]["slip_name_accuracy"] == 0.1 and arms["dpo"]["slip_name_accuracy"] == 0.95
    assert arms["kto"]["other_exact_match"] == 0.9 and arms["sft"]["n"] == {"slip": 20, "other": 400}
    dpo_vs_sft = next(c for c in found["comparisons"] if c["arm"] == "dpo" and c["reference"] == "sft")
    assert dpo_vs_sft["slip_name_accuracy"]["diff"] == 0.85 and dpo_vs_sft["slip_name_accuracy"]["wins"] == 17
    accepted = found["acceptance"]
    assert accepted["dpo"]["slip_fixed"] and accepted["dpo"]["others_non_inferior_pooled"]
    assert accepted["dpo"]["passes_pooled"] and not accepted["dpo"]["passes"]  # 100 per tool cannot show 0.02
    assert accepted["dpo"]["tools_not_shown_non_inferior"] == sorted(TOOLS)
    assert accepted["kto"]["slip_fixed"] and not accepted["kto"]["others_non_inferior_pooled"]
    assert not accepted["grpo"]["no_more_wrong_writes"] and not accepted["grpo"]["passes_pooled"]
    assert not accepted["sft"]["slip_fixed"]

    results, out = tmp_path / "results", tmp_path / "out"
    data = {"benchmark": "tune_slip", "commit": {"sha": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
            "generated_at": "2026-12-07T12:00:00+00:00", "settings": {"slip": "get_order:track_shipment:0.3",
            "fix_floor": 0.8, "fix_gain": 0.3, "margin": 0.02}, "versions": {"sft": "1"},
            "signals": {"queued": 40, "corrected": 19},
            "cost": {"dpo": {"seconds": 80.5, "tokens": 12000, "steps": 60, "pairs": 18}}, **found}  # fmt: skip
    write(results, "tune_slip.json", json.loads(json.dumps(data)))
    render(results, out)
    quality = (out / "quality.md").read_text()
    assert "Tuning from outcomes: an injected teacher slip" in quality and "`0123456`" in quality
    rows = {r["arm"]: r for r in rows_of(quality, "slip: tool name")}
    assert rows["dpo"]["slip: tool name"] == "95 %" and rows["kto"]["other tools: exact"] == "90 %"
    verdicts = {r["arm"]: r for r in rows_of(quality, "passes (pooled)")}
    assert verdicts["dpo"]["passes (pooled)"] == "yes" and verdicts["kto"]["passes (pooled)"] == "no"
    paired = rows_of(quality, "paired 95 % interval")
    assert any(r["comparison"] == "dpo - sft" and r["difference"] == "+85 pp" for r in paired)


def test_an_arm_that_fixes_the_slip_and_holds_every_tool_passes_the_rule_as_the_issue_states_it() -> None:
    """200 requests per tool, each answered as imitation answered it: non-inferior per tool at the 0.02 margin.
    (Mutations: `passes` or `others_non_inferior_every_tool` always false, the per-tool bound read from `diff`
    with a strict margin of 0: each fails.)"""
    bench = _bench()
    report = {"conditions": [_condition("v1", 2, 0, others=800), _condition("imitation", 0, 0, others=800),
                             _condition("dpo", 19, 0, others=800), _condition("kto", 19, 8, others=800)]}  # fmt: skip
    slips = {f"s{i:03d}": True for i in range(20)} | {f"o{i:03d}": False for i in range(800)}
    accepted = bench.verdict(report, slips)["acceptance"]
    assert accepted["dpo"]["others_non_inferior_every_tool"] and accepted["dpo"]["passes"]
    assert accepted["dpo"]["tools_not_shown_non_inferior"] == []
    # kto: 8 wrong answers, all on the first tools' first requests: 2 per tool is 1 point worse, not shown within 0.02
    assert accepted["kto"]["passes_pooled"] and not accepted["kto"]["passes"]


def test_a_bench_run_holds_its_work_folder_and_reads_only_a_state_it_wrote(tmp_path: Path) -> None:
    """`--resume` on a state that is missing, not JSON, not an object or without its keys stops with one `error:`
    line (mutations: the type check removed: `null` gives a TypeError; the keys not checked: a KeyError later);
    a second run on a folder another holds stops at once (mutation: `hold` not taking the lock)."""
    import pytest

    bench = _bench()
    state = tmp_path / "work" / "state.json"
    state.parent.mkdir()
    bench.save_state(state, {"today": "2026-12-07", "sft": {"version": "1"}})
    assert bench.load_state(state, ("today",)) == {"today": "2026-12-07", "sft": {"version": "1"}}
    assert [p.name for p in state.parent.iterdir()] == ["state.json"]  # no partial file left
    for text in (None, "{", "null", "5", "[]", '{"sft": {}}'):
        if text is None:
            state.unlink()
        else:
            state.write_text(text)
        with pytest.raises(SystemExit) as stopped:
            bench.load_state(state, ("today",))
        assert str(stopped.value).startswith("error: ") and "\n" not in str(stopped.value)
    first = bench.hold(tmp_path / "work")
    with pytest.raises(SystemExit, match="error: another run is using"):
        bench.hold(tmp_path / "work")
    first.close()
    bench.hold(tmp_path / "work").close()  # free again once the first run ends
