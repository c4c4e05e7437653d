"""The paired gate (issue 23): decisions on the paired interval of the same requests, never on noise."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipelines.config import load_settings
from pipelines.registry.gate import gate
from pipelines.stats import compare, interval, mcnemar


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory):
    return load_settings(root=str(tmp_path_factory.mktemp("paired-gate")))


def requests(right: list[int], tool: str = "get_order", wrong_writes: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "record_id": f"r{i:03d}",
            "tool": tool,
            "exact_match": r,
            "name_match": 1,
            "arg_f1": float(r),
            "text_f1": None,
            "wrong_write": "wrong_tool" if i < wrong_writes else None,
        }
        for i, r in enumerate(right)
    ]


def row(right: list[int], latency: float = 100.0, tokens: float = 800.0, **kw: Any) -> dict[str, Any]:
    per = requests(right, **kw)
    share = sum(right) / len(right)
    return {
        "exact_match": share,
        "arg_f1": share,
        "latency_ms_p50": latency,
        "prompt_tokens_mean": tokens,
        "examples": len(right),
        "wrong_writes": sum(1 for r in per if r["wrong_write"]),
        "per_tool": {"get_order": {"n": len(right), "exact_match": share, "arg_f1": share}},
        "per_request": per,
    }


def flip(right: list[int], indices: range | list[int], to: int) -> list[int]:
    out = list(right)
    for i in indices:
        out[i] = to
    return out


_RNG = random.Random(7)
BASE = [1 if _RNG.random() < 0.6 else 0 for _ in range(96)]


def test_the_bootstrap_is_paired() -> None:
    """Two conditions that agree on most requests: the paired interval sees a small, consistent gain that two
    independent resamples (an unpaired bootstrap) drown in the spread of each side."""
    reference = [float(x) for x in BASE]
    improved = flip(BASE, [i for i, x in enumerate(BASE) if not x][:10], 1)
    paired = interval([float(x) for x in improved], reference, seed=1)
    assert paired["n"] == 96 and paired["diff"] == pytest.approx(10 / 96, abs=1e-6)
    assert paired["low"] > 0, paired
    same = interval(reference, reference)
    assert same["diff"] == 0 and -0.04 < same["low"] < 0 < same["high"] < 0.04, "96 identical answers: held, narrowly"
    few = interval(reference[:4], reference[:4])
    assert few["low"] <= -0.2, "4 identical answers are no evidence of quality held"
    assert mcnemar(improved, BASE) == {"wins": 10, "losses": 0, "p": pytest.approx(2 / 2**10, abs=1e-5)}
    # requests are matched by record id, not by position: the same answers in another order do not differ
    shuffled = list(reversed(requests(BASE)))
    assert compare(requests(BASE), shuffled)["metrics"]["exact_match"]["mcnemar"] == {"wins": 0, "losses": 0, "p": 1.0}


def test_a_candidate_made_worse_is_refused_with_its_interval(settings) -> None:
    reference = row(BASE)
    worse = row(flip(BASE, [i for i, x in enumerate(BASE) if x][:20], 0), latency=50, tokens=150)
    verdict = gate(worse, None, settings, reference)
    assert not verdict.promoted and verdict.decision == "refused"
    assert verdict.reason.startswith("refused: inferior to base_few_shot: task score -0.208, 98% CI [")
    assert "n=96" in verdict.reason and "\n" not in verdict.reason


def test_an_identical_candidate_is_not_promoted_on_noise(settings) -> None:
    verdict = gate(row(BASE), row(BASE), settings)
    assert not verdict.promoted and "no reason to change" in verdict.reason
    # a few requests either way on a small sample: undecided, not a promotion or a refusal on noise
    small = BASE[:24]
    noisy = flip(small, [i for i, x in enumerate(small) if x][:2], 0)
    noisy = flip(noisy, [i for i, x in enumerate(small) if not x][:1], 1)
    verdict = gate(row(noisy, latency=50), None, settings, row(small))
    assert not verdict.promoted and verdict.decision == "undecided"
    assert verdict.reason.startswith("undecided vs base_few_shot: evaluate more: task score -0.042, 98% CI [")
    # the registry decides on the DAG's last look: not promoted, and the reason no longer asks for more
    from pipelines.registry.gate import last_look

    final = last_look(verdict, 96)
    assert not final.promoted and final.reason.startswith(
        "not promoted: quality not shown to hold at the last look (the sample stops at evaluation.examples = 96; "
        "a larger one may decide): vs base_few_shot: task score -0.042, 98% CI ["
    ), final.reason
    assert last_look(gate(row(BASE, latency=50, wrong_writes=2), row(BASE), settings), 96).reason.startswith(
        "refused: wrong writes"
    )  # a decided verdict is left as it is
    assert "n=24" in verdict.reason


def test_quality_held_and_cheaper_is_promoted_naming_the_rule(settings) -> None:
    reference = row(BASE, latency=100, tokens=870)
    held = row(BASE, latency=55, tokens=146)  # same answers, 45 % faster, 83 % fewer prompt tokens
    verdict = gate(held, None, settings, reference)
    assert verdict.promoted, verdict.reason
    assert verdict.reason.startswith("non-inferior (margin 0.05) to base_few_shot: task score +0.000, 98% CI [-0.0")
    assert verdict.reason.endswith("n=96; latency -45%; prompt tokens -83%; wrong writes 0 vs 0")
    assert not gate(row(BASE[:8], latency=55, tokens=146), None, settings, row(BASE[:8], tokens=870)).promoted, (
        "8 identical answers: undecided, never promoted on a handful"
    )
    better = row(flip(BASE, [i for i, x in enumerate(BASE) if not x][:15], 1), latency=105)
    verdict = gate(better, row(BASE), settings)
    assert verdict.promoted and verdict.reason.startswith("superior to champion: task score +0.156")
    # superior but much slower, or cheaper in tokens but slower: the latency tolerance still holds
    slow = gate(row(flip(BASE, [i for i, x in enumerate(BASE) if not x][:15], 1), latency=150), row(BASE), settings)
    assert not slow.promoted and "slower" in slow.reason
    tokens_only = gate(row(BASE, latency=150, tokens=100), row(BASE, tokens=870), settings)
    assert not tokens_only.promoted and "slower" in tokens_only.reason


def test_wrong_writes_still_veto_a_non_inferior_candidate(settings) -> None:
    verdict = gate(row(BASE, latency=50, wrong_writes=2), row(BASE), settings)
    assert not verdict.promoted and verdict.reason.startswith("refused: wrong writes 2 of 96 vs 0 of 96")


def test_the_dag_evaluates_more_requests_while_the_gate_is_undecided(settings, monkeypatch) -> None:
    """evaluation.first_examples, doubled while undecided, up to evaluation.examples; the larger rounds run
    only the two conditions the gate compares."""
    import pipelines.evaluate.pipeline as pipeline
    import pipelines.registry.models as models
    import pipelines.tasks as tasks
    from pipelines.evaluate.results import ConditionResult, EvalReport
    from pipelines.storage import write_json

    calls: list[tuple[int, list[str] | None]] = []
    # the candidate misses one request the base gets right (the first) and gets three the base misses (late in
    # the sample): undecided on 24 and 48, quality held on 96
    candidate_right = [0] + [1] * 95
    base_right = [0 if i in (60, 61, 62) else 1 for i in range(96)]

    def fake_evaluate(s, cfg, adapters, name, console=None):
        """A stand-in for the evaluator (`evaluate.pipeline.evaluate`: models served and scored): a report with
        the per-request results given above. The real evaluator runs in
        tests/test_sweep_registry.py::test_evaluation_report_compares_conditions_on_the_same_requests."""
        calls.append((cfg.examples, cfg.only))
        n = cfg.examples
        results = []
        for condition, right, latency in (
            ("base_few_shot", base_right[:n], 100.0),
            ("tuned_candidate", candidate_right[:n], 40.0),
        ):
            if cfg.only is not None and condition not in cfg.only:
                continue
            per = requests(right)
            summary = {"exact_match": sum(right) / n, "arg_f1": sum(right) / n, "examples": n, "wrong_writes": 0}
            results.append(
                ConditionResult(
                    condition,
                    "m",
                    "full",
                    0,
                    summary,
                    {"latency_ms_p50": latency, "prompt_tokens_mean": 500.0},
                    {},
                    {"get_order": {"get_order": sum(right), "<invalid>": n - sum(right)}},
                    per_request=per,
                )
            )
        report = EvalReport(name, "d", n, results, settings=cfg.model_dump())  # as the real one records them
        report.json_uri = f"{s.zone('reports')}/{name}.json"
        write_json(report.json_uri, report.to_dict())
        return report

    monkeypatch.setattr(pipeline, "evaluate", fake_evaluate)
    from pipelines.evaluate.report import render_html

    rendered: list[str] = []
    # stand-in for the report's writer, keeping the real page (the real writer: the same test_sweep_registry.py test)
    monkeypatch.setattr(pipeline, "write_report", lambda s, r: rendered.append(render_html(r)) or r)  # the real page
    # stand-in for logging the evaluation to MLflow (the real one: the same test_sweep_registry.py test)
    monkeypatch.setattr(tasks, "_log_evaluation", lambda *a: None)
    # stand-in for the MLflow registry's champion alias, here none; the real one runs in
    # tests/test_dag.py::test_dag_trains_evaluates_registers_promotes_deploys_and_benchmarks_and_a_rerun_changes_nothing
    monkeypatch.setattr(models, "alias_version", lambda *a: None)
    sweep_uri = f"{settings.zone('reports')}/sweep.json"
    write_json(sweep_uri, {"prompt_style": "full", "base_model": "b", "sweep_id": "s"})
    s = settings.model_copy(
        update={
            "evaluation": settings.evaluation.model_copy(
                update={"first_examples": 24, "examples": 96, "constrained": "off"}
            ),
            "triton": settings.triton.model_copy(update={"constrained": False}),
        }
    )
    out = tasks.evaluate(s, {"sweep_uri": sweep_uri, "adapter_dir": "/nowhere", "best_run_id": "r"})
    assert [c[0] for c in calls] == [24, 48, 96]
    assert calls[0][1] is None and calls[1][1] == ["tuned_candidate", "base_few_shot"]
    assert [r["decision"] for r in out["sampling"]] == ["undecided", "undecided", "promoted"]
    assert out["sampling"][-1]["examples"] == 96
    assert (
        "sample size: 24 requests (undecided) -&gt; 48 requests (undecided) -&gt; 96 requests (promoted)"
        in rendered[-1]
    )


def test_a_tuned_candidate_must_hold_against_its_own_sft_adapter(settings) -> None:
    """The SFT rule: a tune method's candidate worse than the SFT adapter it started from is refused, even when
    it would beat the champion; the same answers on 96 requests hold; more wrong writes veto; nothing tuned or
    the rule off: no veto. Mutations tried: the interval check removed (a worse candidate passes): the first
    assertion fails; `sft_rule` ignored: the last but one fails."""
    from pipelines.registry.gate import sft_veto

    worse = row(flip(BASE, [i for i, x in enumerate(BASE) if x][:15], 0))  # 15 right answers lost to tuning
    refused = sft_veto(worse, row(BASE), settings)
    assert refused is not None and refused.startswith("refused: the tuned candidate is not shown non-inferior")
    assert "n=96" in refused
    assert sft_veto(row(BASE), row(BASE), settings) is None  # quality held on 96 paired requests
    assert sft_veto(row(BASE[:8]), row(BASE[:8]), settings) is not None  # 8 requests cannot show it holds
    ww = sft_veto(row(BASE, wrong_writes=2), row(BASE), settings)
    assert ww is not None and ww.startswith("refused: wrong writes 2 of 96 vs 0 of 96") and "tuned_sft" in ww
    assert sft_veto(worse, None, settings) is None
    off = settings.model_copy(update={"promotion": settings.promotion.model_copy(update={"sft_rule": False})})
    assert sft_veto(worse, row(BASE), off) is None
    assert sft_veto({**row(BASE), "per_request": []}, row(BASE), settings) is not None  # unpaired: refused


def test_each_candidate_is_paired_against_the_references_beside_it() -> None:
    """`comparisons`: every tuned condition against base few-shot; a candidate (`tuned_dpo` from `flywheel eval
    --version 3 --adapter dpo=...`, the DAG's `tuned_candidate`) also against the champion, `tuned_sft` and
    `tuned_v3`; a reference against nothing else (mutation: only `tuned_candidate` paired with the references)."""
    from pipelines.evaluate.pipeline import comparisons, is_tuned_reference
    from pipelines.evaluate.results import ConditionResult

    def result(condition: str) -> ConditionResult:
        return ConditionResult(condition, "m", "short", 0, {}, {}, {}, {}, per_request=requests(BASE[:30]))

    names = ["base_few_shot", "tuned_v3", "tuned_dpo", "tuned_champion", "tuned_sft", "tuned_candidate"]
    pairs = {(c["condition"], c["reference"]) for c in comparisons([result(n) for n in names], {})}
    refs = {"base_few_shot", "tuned_champion", "tuned_sft", "tuned_v3"}
    assert pairs == {(cand, ref) for cand in ("tuned_dpo", "tuned_candidate") for ref in refs} | {
        (ref, "base_few_shot") for ref in ("tuned_v3", "tuned_champion", "tuned_sft")
    }
    assert is_tuned_reference("tuned_v12_constrained") and not is_tuned_reference("tuned_variant-01")
