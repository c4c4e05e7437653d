"""The results pages are rendered from the results files: each section shows its commit, its n and the interval
the file records (never one made up); a file without a commit is refused, named; the real folder renders whole."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from docs.generate.results import ResultsError, main, render

ROOT = Path(__file__).resolve().parents[1]

ENGINE = {
    "benchmark": "multi_lora",
    "commit": "abcdef1234567890abcdef1234567890abcdef12",
    "utc": "2026-01-02T03:04:05+00:00",
    "device": "test machine 9000",
    "argv": ["bench/multi_lora.py", "--rounds", "7"],
    "settings": {"shape": "tiny", "rank": 4, "prompt_tokens": 8, "new_tokens": 8, "rounds": 7, "seed": 3},
    "summary": [
        {"condition": "merged", "concurrency": 1, "reference": "merged", "calls": 7, "errors": 0,
         "tokens_per_s": 10.0, "ratio_to_reference": {"n": 7, "mean": 1.0, "low": 1.0, "high": 1.0}},
        {"condition": "batched_1", "concurrency": 1, "reference": "merged", "calls": 7, "errors": 0,
         "tokens_per_s": 8.7, "ratio_to_reference": {"n": 7, "mean": 0.873, "low": 0.812, "high": 0.934}},
        {"condition": "batched_4", "concurrency": 1, "reference": "merged", "calls": 1, "errors": 0,
         "tokens_per_s": 8.1, "ratio_to_reference": {"n": 1, "mean": 0.811, "low": None, "high": None}},
    ],
}  # fmt: skip
QUALITY = {
    "commit": {"sha": "1234567fedcba9876543210fedcba98765432100", "dirty": False},
    "generated_at": "2026-01-02T05:00:00+00:00",
    "cases": {
        "toy": {
            "examples": 37,
            "commit": {"sha": "7654321aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "dirty": False},
            "rows": [{"condition": "tuned", "exact_match": 0.5, "name_accuracy": 0.75, "arg_f1": 0.6}],
            "comparisons": [
                {"condition": "tuned", "reference": "base", "n": 37,
                 "metrics": {"exact_match": {"diff": 0.25, "low": 0.11, "high": 0.39, "n": 37}}},
            ],
        }
    },
}  # fmt: skip


def write(folder: Path, name: str, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def rows_of(markdown: str, header_cell: str) -> list[dict[str, str]]:
    """The rows of the first table whose header has `header_cell`, as dicts by header."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and header_cell in cells:
            body = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                body.append(dict(zip(cells, (c.strip() for c in row.strip().strip("|").split("|")))))
            return body
    raise AssertionError(f"no table with a {header_cell!r} column")


def test_a_section_shows_its_commit_n_and_interval(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    write(results, "multi_lora_tiny.json", ENGINE)
    write(results, "real_data.json", QUALITY)
    written = render(results, out)
    bench, quality = (out / "benchmarks.md").read_text(), (out / "quality.md").read_text()
    assert out / "benchmarks.md" in written and out / "quality.md" in written

    assert "`abcdef1`" in bench and "2026-01-02 03:04 UTC" in bench and "test machine 9000" in bench
    rows = {r["condition"]: r for r in rows_of(bench, "n (rounds)")}
    assert rows["batched_1"]["n (rounds)"] == "7"
    interval = next(k for k in rows["batched_1"] if "interval" in k)
    assert rows["batched_1"][interval] == "[0.812, 0.934]"
    assert rows["batched_4"][interval] == "no interval recorded"  # none in the file: none made up
    plot = re.search(r"!\[[^\]]*\]\((img/[^)]+\.png)\)", bench)
    assert plot and (out / plot[1]).is_file()

    assert "`1234567`" in quality and "`7654321`" in quality and "n = 37 held-out examples" in quality
    (comparison,) = rows_of(quality, "paired 95 % interval")
    assert comparison["n"] == "37" and comparison["metric"] == "exact_match"
    assert comparison["difference"] == "+25 pp" and comparison["paired 95 % interval"] == "[+11 pp, +39 pp]"


def test_a_results_file_without_a_commit_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    write(results, "multi_lora_tiny.json", ENGINE)
    write(results, "nameless.json", {k: v for k, v in ENGINE.items() if k != "commit"})
    with pytest.raises(ResultsError, match=r"nameless\.json: no commit recorded"):
        render(results, out)
    assert not (out / "benchmarks.md").exists()  # refused before anything is written

    assert main(["--results", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "nameless.json" in err[0]

    write(results, "nameless.json", {**ENGINE, "commit": {"sha": "", "dirty": False}})
    with pytest.raises(ResultsError, match="nameless.json"):
        render(results, out)


def test_the_real_results_render_and_every_file_is_on_a_page(tmp_path: Path) -> None:
    results = ROOT / "bench" / "results"
    render(results, tmp_path)
    pages = (tmp_path / "benchmarks.md").read_text() + (tmp_path / "quality.md").read_text()
    missing = [p.name for p in sorted(results.glob("*.json")) if f"### {p.name}\n" not in pages]
    assert missing == []
    assert "### real_data.json" in (tmp_path / "quality.md").read_text()
    links = re.findall(r"\]\((img/[^)]+)\)", pages)
    assert links and all((tmp_path / link).is_file() for link in links)


EPISODES = {
    "benchmark": "episodes",
    "commit": {"sha": "89abcdef0123456789abcdef0123456789abcdef", "dirty": False},
    "generated_at": "2026-01-03T05:00:00+00:00",
    "version": "3",
    "split": {"evaluated_tasks": 120, "train_tasks": 380},
    "runs": {"tuned": {"scored": 116, "skipped": 4, "cut_by_time_budget": False},
             "base": {"scored": 116, "skipped": 4, "cut_by_time_budget": True}},
    "settings": {"episodes": {"k": 4}},
    "conditions": {
        "tuned_champion": {"condition": "tuned_champion", "tasks": 116, "closed_loop_pass^1": 0.25,
                           "closed_loop_pass^4": 0.125, "wrong_writes": 3},
        "base_zero_shot": {"condition": "base_zero_shot", "tasks": 40, "closed_loop_pass^1": 0.05, "wrong_writes": 9},
    },
    "comparisons": [{"condition": "tuned_champion", "reference": "base_zero_shot", "n": 40, "wrong_writes": [1, 9],
                     "metrics": {"success": {"n": 40, "diff": 0.2, "low": 0.05, "high": 0.35,
                                             "mcnemar": {"wins": 9, "losses": 1, "p": 0.02}},
                                 "pass^4": {"n": 0, "diff": None, "low": None, "high": None}}}],
}  # fmt: skip


def test_the_episode_results_show_each_condition_the_cut_run_and_the_paired_interval(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    write(results, "episodes_retail.json", EPISODES)
    render(results, out)
    quality = (out / "quality.md").read_text()
    assert "Episodes against the retail environment" in quality and "`89abcde`" in quality
    assert "Cut by its time budget: base run" in quality
    rows = {r["condition"]: r for r in rows_of(quality, "closed loop pass^1")}
    assert rows["tuned_champion"]["closed loop pass^4"] == "12.5 %" and rows["base_zero_shot"]["tasks"] == "40"
    comparisons = rows_of(quality, "paired 95 % interval")
    success = next(r for r in comparisons if r["metric"] == "success")
    assert success["tasks"] == "40" and success["paired 95 % interval"] == "[+5 pp, +35 pp]"
    assert not any(r["metric"] == "pass^4" for r in comparisons)  # nothing paired: no row made up
    assert any(r["difference"] == "1 vs 9" for r in comparisons)


TUNE_RETAIL = {
    "benchmark": "tune_retail",
    "commit": {"sha": "fedcba9876543210fedcba9876543210fedcba98", "dirty": False},
    "generated_at": "2026-12-07T09:00:00+00:00",
    "version": "1",
    "split": {"evaluated_tasks": 120, "train_tasks": 400, "requests": 120},
    "settings": {"not_run": {"kto": "no thumbs"}},
    "pairs": {"pairs": 57},
    "rows": {"tuned_v1_constrained": {"exact_match": 0.5, "wrong_writes": 2},
             "tuned_grpo_constrained": {"exact_match": 0.55, "wrong_writes": 1}},
    "comparisons": [{"condition": "tuned_grpo_constrained", "reference": "tuned_v1_constrained", "n": 120,
                     "wrong_writes": [1, 2], "metrics": {"exact_match": {"n": 120, "diff": 0.05, "low": -0.01,
                                                                         "high": 0.11}}}],
    "cost": {"grpo": {"seconds": 900, "tokens": 50000, "steps": 20, "prompts": 256},
             "dpo": {"seconds": 300, "tokens": 40000, "steps": 60, "pairs": 57}},
}  # fmt: skip


def test_the_retail_tuning_results_show_each_arm_its_paired_interval_and_what_did_not_run(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    write(results, "tune_retail.json", TUNE_RETAIL)
    render(results, out)
    quality = (out / "quality.md").read_text()
    assert "Tuning after SFT on tau-bench retail" in quality and "`fedcba9`" in quality
    rows = {r["condition"]: r for r in rows_of(quality, "argument F1")}
    assert rows["tuned_grpo_constrained"]["exact match"] == "55 %"
    paired = rows_of(quality, "paired 95 % interval")
    assert any(r["metric"] == "exact_match" and r["paired 95 % interval"] == "[-1 pp, +11 pp]" for r in paired)
    assert any(r["metric"] == "wrong writes" and r["difference"] == "1 vs 2" for r in paired)
    assert "Not run: kto: no thumbs." in quality and "shadow run and any other source: 57" in quality
    cost = {r["method"]: r for r in rows_of(quality, "tokens trained")}
    assert (
        cost["grpo"]["prompts (GRPO) or pairs (DPO)"] == "256" and cost["dpo"]["prompts (GRPO) or pairs (DPO)"] == "57"
    )


def test_a_p_value_recorded_as_zero_is_shown_below_the_rounding_not_as_zero() -> None:
    """`stats.mcnemar` rounds p to six decimals: a 0 is shown as below 5e-07 (mutation: `num(p)` again: "p = 0")."""
    from docs.generate.quality import mcnemar

    assert mcnemar({"wins": 122, "losses": 0, "p": 0.0}) == "122 / 0 (p < 5e-07)"
    assert mcnemar({"wins": 9, "losses": 1, "p": 0.02}) == "9 / 1 (p = 0.02)" and mcnemar(None) == ""


DEMO = {
    "benchmark": "demo",
    "commit": {"sha": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
    "generated_at": "2026-01-04T06:00:00+00:00",
    "machine": "test machine, 2 cores",
    "settings": {"goal_s": 600},
    "n": 1,
    "returncode": 0,
    "seconds": 701.5,
    "goal_met": False,
    "tasks": [{"task": "train", "seconds": 300.2, "summary": "best variant: two"},
              {"task": "evaluate", "seconds": 150.0, "summary": "exact match 0.667"}],
    "seconds_in_tasks": 450.2,
    "seconds_outside_tasks": 251.3,
}  # fmt: skip


def test_the_demo_time_shows_the_goal_the_verdict_and_each_task(tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    write(results, "demo.json", DEMO)
    render(results, out)
    page = (out / "benchmarks.md").read_text()
    assert "`make demo` after the install" in page and "`0123456`" in page
    [head] = rows_of(page, "goal s")
    assert (head["seconds"], head["goal s"], head["goal"], head["the run"]) == ("702", "600", "not met", "finished")
    tasks = {r["DAG task"]: r for r in rows_of(page, "what it printed")}
    assert tasks["train"]["seconds"] == "300" and tasks["train"]["what it printed"] == "best variant: two"
    assert "One run: no interval recorded." in page
    write(
        results,
        "demo.json",
        {**DEMO, "returncode": -15, "timed_out": True, "settings": {"goal_s": 600, "timeout_s": 4500}},
    )
    render(results, out)
    [head] = rows_of((out / "benchmarks.md").read_text(), "goal s")
    assert head["the run"] == "timed out (stopped after 4,500 s)" and head["goal"] == "not met"
    assert "no bf16 units" not in (out / "benchmarks.md").read_text()
    # whole seconds (the parts add up as read: not three significant figures each), and a machine without bf16
    # units said to be one, its time not judging the goal
    slow = {**DEMO, "machine": "test machine, 2 cores, bf16 units: no", "seconds": 1388.6,
            "seconds_in_tasks": 1334.3, "seconds_outside_tasks": 54.3}  # fmt: skip
    write(results, "demo.json", slow)
    render(results, out)
    page = (out / "benchmarks.md").read_text()
    [head] = rows_of(page, "goal s")
    assert (head["seconds"], head["seconds in DAG tasks"], head["outside them"]) == ("1,389", "1,334", "54")
    assert "This machine has no bf16 units" in page and "does not judge the goal" in page


SHARED = {
    "benchmark": "shared_prefix",
    "commit": {"sha": "89abcdef0123456789abcdef0123456789abcdef", "dirty": False},
    "generated_at": "2026-01-05T06:00:00+00:00",
    "machine": "test machine, 2 cores, bf16 units: no",
    "n": 12,
    "speedup": {"n": 2, "mean": 2.5, "low": 1.9, "high": 3.3, "level": 0.95},
    "identical_answers": 11,
    "seconds_whole": 200.0,
    "seconds_shared": 80.0,
    "batches": [{"batch": 0, "requests": 8, "first": "shared", "shared_prefix_tokens": 2913, "speedup": 2.6,
                 "identical_answers": 8},
                {"batch": 1, "requests": 4, "first": "whole", "shared_prefix_tokens": 2913, "speedup": 2.4,
                 "identical_answers": 3}],
}  # fmt: skip


def test_the_shared_prefix_results_show_the_paired_interval_every_batch_and_the_answers_compared(
    tmp_path: Path,
) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    write(results, "shared_prefix.json", SHARED)
    render(results, out)
    page = (out / "benchmarks.md").read_text()
    assert "Decoding requests that open alike" in page and "bf16 units: no" in page
    [head] = rows_of(page, "speedup (whole / shared)")
    assert (head["speedup (whole / shared)"], head["95 % interval"]) == ("2.5", "[1.9, 3.3]")
    assert head["identical answers"] == "11 of 12" and head["batches"] == "2"
    batches = rows_of(page, "first pass")
    assert [b["first pass"] for b in batches] == ["shared", "whole"] and batches[1]["identical answers"] == "3"
