"""Tuning after SFT (issue 51): the preference pairs' policy and DPO on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pipelines.prep.pairs import build_pairs, pair_summary
from pipelines.tune.dpo import DpoConfig, fitting, preference_rows, too_few, train_dpo

TOOLS = json.dumps([{"name": n, "description": "", "parameters": {"type": "object"}} for n in ("get_order", "track")])


def _example(
    record_id: str, target: dict[str, Any], label_source: str, request: str = "where is #W1?", split: str = "train"
) -> dict:
    return {
        "record_id": record_id,
        "session_id": f"s-{record_id}",
        "split": split,
        "event_timestamp": pd.Timestamp("2026-11-20T10:00:00Z"),
        "context": None,
        "system_prompt": "You are the agent.",
        "messages_json": json.dumps([{"role": "user", "content": request}]),
        "tools_json": TOOLS,
        "target_json": json.dumps(target),
        "label_source": label_source,
    }


ORDER = {"name": "get_order", "arguments": {"order_id": "#W1"}}
TRACK = {"name": "track", "arguments": {"order_id": "#W1"}}


def _shadow(record_id: str, answer: Any, exact: bool = False, mode: str = "shadow") -> dict[str, Any]:
    return {"record_id": record_id, "mode": mode, "arm": "candidate", "answer": answer, "agreement": {"exact": exact}}


def test_pairs_keep_the_label_policy_and_count_what_they_drop() -> None:
    """Mutations tried: the own-model rule removed (a `champion` chosen side trains): the first assertion fails;
    `OUR_MODEL` without `verified`, equal sides kept, the offered-tools check on the chosen side removed, the
    dedupe removed, a shadow answer with no call kept, canary comparisons not read, a canary's champion-answered
    request read, a canary answer a person rated up rejected, a teacher's relabel counted as a person's
    correction: each fails."""
    examples = pd.DataFrame(
        [
            _example("c1-review", ORDER, "human"),  # a person corrected c1's track into get_order
            _example("t1", ORDER, "teacher", "order #W1?"),  # the teacher's answer the candidate disagreed with
            _example("own", ORDER, "champion", "mine"),  # a champion answer rated up: not a chosen side
            _example("ver", ORDER, "verified", "episode"),  # a successful episode of ours: not a chosen side either
            _example("t-val", ORDER, "teacher", "held out", split="val"),  # its session is in the val split
            _example("t-none", ORDER, "teacher", "no call"),
            _example("t-unparsed", ORDER, "teacher", "unparsed"),
            _example("t-same", ORDER, "teacher", "same"),  # the candidate said the same: no preference
            _example("t-off", {"name": "cancel", "arguments": {}}, "teacher", "off"),  # not an offered tool
            _example("t-bad", ORDER, "teacher", "bad"),
            _example("t-unknown", ORDER, "teacher", "unknown"),
            _example("t-agreed", ORDER, "teacher", "agreed"),
            _example("dup-review", ORDER, "human"),  # the same prompt and sides as c1's correction
            _example("r1-review", ORDER, "teacher", "relabel"),  # the teacher answered r1, rated down, again
            _example("k1-teacher", ORDER, "teacher", "canary"),  # the teacher's copy of a request the canary served
            _example("k2-teacher", ORDER, "teacher", "rated up"),  # the caller rated the canary's answer up
        ]
    )
    originals = {
        "c1": {"record_id": "c1", "tool": "track", "arguments_json": '{"order_id":"#W1"}', "label_source": "teacher"},
        "dup": {"record_id": "dup", "tool": "track", "arguments_json": '{"order_id":"#W1"}', "label_source": "x"},
        "r1": {"record_id": "r1", "tool": "track", "arguments_json": '{"order_id":"#W1"}', "label_source": "champion"},
        "k2": {"record_id": "k2", "tool": "track", "label_source": "champion", "feedback": "up"},
    }
    comparisons = [
        _shadow("t1", TRACK),
        _shadow("own", TRACK),
        _shadow("ver", TRACK),
        _shadow("t-val", TRACK),
        _shadow("t-none", {"name": None}),  # an abstention or a text answer: the record cannot tell them apart
        _shadow("t-unparsed", {"name": "track", "arguments": {"<unparsed>": "{order"}}),
        _shadow("t-same", ORDER),
        _shadow("t-off", TRACK),
        _shadow("t-bad", "{not json"),
        _shadow("t-unknown", {"name": "refund_everything", "arguments": {}}),
        _shadow("t-agreed", TRACK, exact=True),
        _shadow("t1", TRACK, mode="canary"),  # a canary comparison: its chosen side is t1's teacher copy (none)
        _shadow("k1", TRACK, mode="canary"),  # the candidate served k1 and disagreed with the teacher's copy
        _shadow("k2", TRACK, mode="canary"),
        {**_shadow("k1", TRACK, mode="canary"), "arm": "champion"},  # the champion answered: nothing compared
        _shadow("missing", TRACK),
    ]
    pairs, dropped, quarantined = build_pairs(examples, originals, comparisons)
    assert not {"own", "ver"} & set(pairs["record_id"])  # our own model never writes a chosen side
    assert dropped == {
        "correction: duplicate": 1,
        "shadow: chosen side written by our own model (champion)": 1,
        "shadow: chosen side written by our own model (verified)": 1,
        "shadow: the candidate made no call (an abstention or text, not told apart)": 1,
        "shadow: equal sides": 1,
        "shadow: the chosen call is not one of the offered tools": 1,
        "shadow: the teacher's answer is not a curated example": 1,
        "canary: the teacher's answer is not a curated example": 1,
        "canary: a person rated the candidate's answer up": 1,
    }
    assert sorted((q["record_id"], q["reason"]) for q in quarantined) == [
        ("t-bad", "unparseable_side"),
        ("t-unknown", "unknown_tool"),
        ("t-unparsed", "unparseable_side"),
    ]
    rows = {r["pair_id"]: r for r in pairs.to_dict("records")}
    assert set(rows) == {"correction:c1-review", "shadow:t1", "shadow:t-val", "relabel:r1-review", "canary:k1-teacher"}
    assert rows["shadow:t-val"]["split"] == "val"  # a pair's split is its session's
    for row in rows.values():
        assert json.loads(row["chosen_json"]) == ORDER and json.loads(row["rejected_json"]) == TRACK
    summary = pair_summary(pairs, dropped, quarantined)
    assert summary["by_source"] == {
        "correction": {"train": 1},
        "relabel": {"train": 1},
        "shadow": {"train": 1, "val": 1},
        "canary": {"train": 1},
        "evaluation": {},
    }
    assert summary["pairs"] == 5


def test_a_correction_whose_original_is_gone_is_dropped_and_said() -> None:
    pairs, dropped, _ = build_pairs(pd.DataFrame([_example("x-review", ORDER, "human")]), {}, [])
    assert pairs.empty and dropped == {"correction: original answer not in the clean logs": 1}


def test_pairs_read_only_the_originals_of_corrections_from_the_clean_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`collect_pairs` reads of the clean-log history only the rows a correction needs, and no file at all when
    the training set holds none (mutation: every row read; an unreadable day would then fail the count)."""
    from pipelines.config import load_settings
    from pipelines.prep import dataset
    from pipelines.prep.pairs import collect_pairs
    from pipelines.prep.pipeline import zone_paths

    settings = load_settings(root=str(tmp_path))
    logs = Path(zone_paths(settings)["clean_logs"])
    (logs / "dt=2026-11-20").mkdir(parents=True)
    rows = [{"record_id": r, "tool": "track", "arguments_json": '{"order_id": "#W1"}', "label_source": "champion",
             "feedback": "down"} for r in ("c1", "other")]  # fmt: skip
    pd.DataFrame(rows).to_parquet(logs / "dt=2026-11-20" / "part-0.parquet")
    (logs / "dt=2026-11-21").mkdir()
    (logs / "dt=2026-11-21" / "part-0.parquet").write_bytes(b"not parquet")  # a day nothing needs
    monkeypatch.setattr(dataset, "load_split", lambda settings, split: pd.DataFrame([_example("t1", ORDER, "teacher")]))
    pairs, _, _ = collect_pairs(settings)  # no correction: the clean logs are not read
    assert pairs.empty
    (logs / "dt=2026-11-21" / "part-0.parquet").unlink()
    read: list[int] = []  # rows each read returned
    original = pd.read_parquet

    def counted(*args: Any, **kwargs: Any) -> pd.DataFrame:
        frame = original(*args, **kwargs)
        read.append(len(frame))
        return frame

    monkeypatch.setattr(pd, "read_parquet", counted)
    corrected = pd.DataFrame([_example("c1-review", ORDER, "human")])
    monkeypatch.setattr(dataset, "load_split", lambda settings, split: corrected)
    pairs, _, _ = collect_pairs(settings)
    assert list(pairs["record_id"]) == ["c1-review"] and json.loads(pairs.iloc[0]["rejected_json"]) == TRACK
    assert read == [1]  # c1's row alone, not the day's others


def test_too_few_pairs_skip_dpo_with_one_line_saying_how_many() -> None:
    assert too_few(3, DpoConfig(min_pairs=16)) == (
        "dpo: skipped: 3 training pair(s), it needs at least 16 (--min-pairs)"
    )
    assert too_few(16, DpoConfig(min_pairs=16)) is None


def tiny_sft(tmp_path: Path) -> tuple[Any, Path]:
    """The tiny model's loader and a fresh (zero) LoRA adapter on it in `tmp_path/sft`: an SFT adapter to tune."""
    from peft import LoraConfig, get_peft_model

    from pipelines.base_models import load_base
    from pipelines.config import load_settings

    settings = load_settings(root=str(tmp_path / "fw"))

    def base() -> Any:
        return load_base("tiny-llama", settings)

    model, _ = base()
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(model, lora).save_pretrained(str(tmp_path / "sft"))
    return base, tmp_path / "sft"


@pytest.mark.slow
def test_dpo_moves_the_sft_adapter_towards_the_chosen_call_and_stock_peft_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DPO from an SFT adapter on the tiny model: the chosen call's log-probability rises against the rejected
    one's, relative to the SFT model; after every step the freed heap goes back to the system (without it a long
    run on real prompts grew until it was killed). Mutations tried: the SFT adapter loaded frozen
    (is_trainable=False): no parameter trains and the margin does not move; the step-end trim removed: each fails."""
    from peft import PeftModel

    from pipelines import hardware

    trims: list[int] = []
    monkeypatch.setattr(hardware, "release_freed_memory", lambda: trims.append(1) or True)
    from pipelines.toolcall.decode import target_logprobs

    base, sft = tiny_sft(tmp_path)
    pairs = pd.DataFrame(
        [
            {
                **_example(f"r{i}", ORDER, "teacher"),
                "chosen_json": json.dumps(ORDER),
                "rejected_json": json.dumps(TRACK),
            }
            for i in range(8)
        ]
    )
    rows = preference_rows(pairs, "short")  # the tuned versions' default style
    turns, chosen, rejected = rows[0]
    _, tokenizer = base()
    assert fitting(rows, tokenizer, DpoConfig(max_length=40))[1] == 8  # too long for 40 tokens: left out, counted

    def margin(adapter: Path) -> float:
        m, t = base()
        m = PeftModel.from_pretrained(m, str(adapter)).merge_and_unload().eval()
        good, bad = target_logprobs(m, t, [turns, turns], [chosen, rejected])
        return good - bad

    cfg = DpoConfig(max_steps=12, batch_size=4, learning_rate=5e-3, min_pairs=1, beta=0.5)
    result = train_dpo(rows, cfg, sft, tmp_path / "dpo", base)
    assert result.steps == 12 and result.pairs == 8 and len(result.losses) == 12 and result.tokens > 0
    assert len(trims) == 12
    assert result.too_long == 0
    assert (Path(result.adapter_dir) / "adapter_config.json").is_file()
    assert margin(Path(result.adapter_dir)) > margin(sft) + 0.5
    assert result.losses[-1] < result.losses[0]


def test_an_offline_shadow_run_pairs_the_gold_over_our_models_wrong_answers() -> None:
    """`flywheel eval` of one of our models on the training set's split is an offline shadow run: where its answer
    was not the example's call, the example's (gold) call over the model's answer. Mutations tried: the right
    answers kept (an equal-sides pair is counted where none should be: the dropped counts differ); the base
    conditions read (the base model's answer becomes a pair): each fails."""
    examples = pd.DataFrame(
        [_example("g1", ORDER, "import"), _example("g2", ORDER, "import", "b"), _example("own", ORDER, "champion")]
    )

    def answer(record_id: str, output: str, exact: int = 0) -> dict[str, Any]:
        return {"record_id": record_id, "exact_match": exact, "output": output}

    report = {
        "conditions": [
            {"condition": "tuned_v1_constrained", "per_request": [
                answer("g1", json.dumps(TRACK)),  # wrong: a pair
                answer("g2", json.dumps(ORDER), exact=1),  # right: no pair
                answer("own", json.dumps(TRACK)),  # our own model's label: never a chosen side
                answer("gone", json.dumps(TRACK)),  # not a curated example
                answer("g2", "I cannot help with that"),  # no call: left out
                {"record_id": "g2", "exact_match": 0},  # a report from before answers were kept: counted
            ]},
            {"condition": "base_zero_shot", "per_request": [answer("g2", json.dumps(TRACK))]},  # not ours
        ]
    }  # fmt: skip
    pairs, dropped, quarantined = build_pairs(examples, {}, [], [report])
    assert list(pairs["record_id"]) == ["g1"] and quarantined == []
    assert json.loads(pairs.iloc[0]["chosen_json"]) == ORDER and json.loads(pairs.iloc[0]["rejected_json"]) == TRACK
    assert pairs.iloc[0]["source"] == "evaluation"
    with_shadow = build_pairs(examples, {}, [_shadow("g2", TRACK)], [report])[0].set_index("source")  # a pair more
    assert len(with_shadow) == 2
    assert with_shadow.loc["evaluation", "pair_id"] == pairs.iloc[0]["pair_id"], "an id whatever else the table holds"
    assert dropped == {
        "evaluation: chosen side written by our own model (champion)": 1,
        "evaluation: the model made no call": 1,
        "evaluation: the report kept no answer (written before answers were kept)": 1,
        "evaluation: the request is not a curated example": 1,
    }


def test_collected_pairs_read_the_rating_of_each_canary_answer_from_the_clean_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`collect_pairs` reads the served turn of each canary disagreement from the clean logs, so an answer the
    caller rated up is never a rejected side (mutation tried: the canary ids left out of the rows read, and the
    pair is built)."""
    from pipelines.config import load_settings
    from pipelines.prep import dataset
    from pipelines.prep.pairs import collect_pairs
    from pipelines.prep.pipeline import zone_paths

    settings = load_settings(root=str(tmp_path))
    logs = Path(zone_paths(settings)["clean_logs"], "dt=2026-11-20")
    logs.mkdir(parents=True)
    rows = [{"record_id": r, "tool": "track", "arguments_json": "{}", "label_source": "champion", "feedback": f}
            for r, f in (("k1", "up"), ("k2", "none"))]  # fmt: skip
    pd.DataFrame(rows).to_parquet(logs / "part-0.parquet")
    examples = [_example("k1-teacher", ORDER, "teacher", "a"), _example("k2-teacher", ORDER, "teacher", "b")]
    monkeypatch.setattr(dataset, "load_split", lambda settings, split: pd.DataFrame(examples))
    agreement = Path(settings.zone("serving"), "gateway", "agreement", "dt=2026-11-20")
    agreement.mkdir(parents=True)
    lines = [json.dumps(_shadow(k, TRACK, mode="canary")) for k in ("k1", "k2")]
    (agreement / "a.jsonl").write_text("\n".join(lines) + "\n")
    pairs, dropped, _ = collect_pairs(settings)
    assert list(pairs["pair_id"]) == ["canary:k2-teacher"]
    assert dropped == {"canary: a person rated the candidate's answer up": 1}
