"""KTO from unpaired thumbs (issue 51, item 2): the rated answers' policy, the weights, KTO on a tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from test_tune import ORDER, TRACK, _example, tiny_sft

from pipelines.config.tune import KtoSettings
from pipelines.prep.thumbs import build_thumbs, thumb_summary
from pipelines.tune.kto import balanced_weights, fitting, thumb_rows, too_few, train_kto


def _rated(record_id: str, target: Any, feedback: str, label_source: str = "teacher", **kw: Any) -> dict:
    row = _example(record_id, ORDER, label_source, **kw)
    return {**row, "target_json": target if isinstance(target, str) else json.dumps(target), "feedback": feedback}


def test_thumbs_take_only_what_a_person_rated_or_corrected_and_count_what_they_drop() -> None:
    """Mutations tried: any feedback taken (an unrated champion answer enters as desirable): the first assertion
    fails; a down rating made desirable; the offered-tools check removed; the contradiction rule removed, or keyed
    on the whole prompt (which names the customer and day: the two contradicting ratings below come from different
    customers); the dedupe removed; the project's label sources ignored: each fails."""
    rated = pd.DataFrame(
        [
            _rated("up1", ORDER, "up", request="order #W1?"),
            _rated("mine-up", ORDER, "up", "champion", request="mine"),  # our answer, confirmed by a person
            _rated("mine", ORDER, "none", "champion", request="unrated"),  # nobody rated it: never enters
            _rated("down1", TRACK, "down", request="where is #W1?"),  # the slip a person caught
            _rated("down-val", TRACK, "down", request="val", split="val"),
            _rated("bad", "{not json", "down", request="bad"),
            _rated("off", {"name": "cancel", "arguments": {}}, "up", request="off"),
            _rated("both-up", TRACK, "up", request="both"),  # two identical turns rated both ways
            {**_rated("both-down", TRACK, "down", request="both"), "system_prompt": "Another customer, day."},
            _rated("dup", ORDER, "up", request="order #W1?"),  # the same prompt and answer as up1
            {**_rated("imp", ORDER, "up", "import", request="imported"),  # a source this project does not train
             "held": "label source import does not train (quality.train_label_sources)"},
        ]
    )  # fmt: skip
    examples = pd.DataFrame([_example("down1-review", ORDER, "human"), _example("t1", ORDER, "teacher", "x")])
    thumbs, dropped, quarantined = build_thumbs(rated, examples)
    rows = {r["thumb_id"]: r for r in thumbs.to_dict("records")}
    assert set(rows) == {"up:up1", "up:mine-up", "down:down1", "down:down-val", "correction:down1-review"}
    assert [rows[k]["desirable"] for k in sorted(rows)] == [True, False, False, True, True]
    assert json.loads(rows["down:down1"]["completion_json"]) == TRACK
    assert json.loads(rows["correction:down1-review"]["completion_json"]) == ORDER
    assert rows["down:down-val"]["split"] == "val"
    assert dropped == {
        "down: the same answer rated both up and down": 1,
        "up: duplicate": 1,
        "up: its label source does not train (quality.train_label_sources)": 1,
        "up: the same answer rated both up and down": 1,
    }
    assert sorted((q["record_id"], q["reason"]) for q in quarantined) == [
        ("bad", "unparseable_side"),
        ("off", "unknown_tool"),
    ]
    summary = thumb_summary(thumbs, dropped, quarantined)
    assert summary["by_source"] == {"up": {"train": 2}, "down": {"train": 1, "val": 1}, "correction": {"train": 1}}
    assert (summary["train_desirable"], summary["train_undesirable"]) == (3, 1)
    assert summary["quarantined"] == {"unparseable_side": 1, "unknown_tool": 1}


def test_too_few_thumbs_or_none_down_skip_kto_with_one_line_saying_how_many() -> None:
    cfg = KtoSettings(min_rows=16)
    assert too_few(3, 2, cfg) == (
        "kto: skipped: 3 desirable and 2 undesirable training answer(s), it needs at least 16 in all (--min-rows) "
        "and one undesirable"
    )
    assert too_few(40, 0, cfg) is not None  # nothing rated down: nothing for KTO to add to SFT
    assert too_few(15, 1, cfg) is None


def test_the_rarer_side_is_weighted_up_unless_the_settings_fix_the_weights() -> None:
    assert balanced_weights(30, 10, KtoSettings()) == (1.0, 3.0)  # weight x count equal on both sides
    assert balanced_weights(5, 20, KtoSettings()) == (4.0, 1.0)
    assert balanced_weights(5, 20, KtoSettings(desirable_weight=1.0, undesirable_weight=1.0)) == (1.0, 1.0)
    with pytest.raises(ValueError, match="set both desirable_weight and undesirable_weight, or neither"):
        KtoSettings(desirable_weight=2.0)  # one weight alone would be ignored: refused instead


@pytest.mark.slow
def test_kto_moves_the_sft_adapter_away_from_the_down_rated_call(tmp_path: Path) -> None:
    """KTO from an SFT adapter on the tiny model, the slip rated down and the right call rated up (unpaired: on
    different requests): the right call's log-probability rises against the slip's on the down-rated request,
    relative to the SFT model. Mutation tried: the labels inverted in `fitting` (down desirable): the margin
    falls and it fails."""
    from peft import PeftModel

    from pipelines.toolcall.decode import target_logprobs

    base, sft = tiny_sft(tmp_path)
    thumbs = pd.DataFrame(
        [{**_example(f"d{i}", TRACK, "teacher"), "completion_json": json.dumps(TRACK), "desirable": False}
         for i in range(6)]
        + [{**_example(f"u{i}", ORDER, "teacher", f"order {i}"), "completion_json": json.dumps(ORDER),
            "desirable": True} for i in range(6)]
    )  # fmt: skip
    rows = thumb_rows(thumbs, "short")
    turns = rows[0][0]  # the down-rated request
    _, tokenizer = base()
    assert fitting(rows, tokenizer, KtoSettings(max_length=40))[1] == 12  # too long for 40 tokens: left out

    def margin(adapter: Path) -> float:
        m, t = base()
        m = PeftModel.from_pretrained(m, str(adapter)).merge_and_unload().eval()
        from pipelines.toolcall.calls import call_text

        good, bad = target_logprobs(m, t, [turns, turns], [call_text(json.dumps(ORDER)), call_text(json.dumps(TRACK))])
        return good - bad

    cfg = KtoSettings(max_steps=12, batch_size=4, learning_rate=5e-3, min_rows=1, beta=0.5)
    result = train_kto(rows, cfg, sft, tmp_path / "kto", base)
    assert result.steps == 12 and result.rows == 12 and len(result.losses) == 12 and result.tokens > 0
    assert (result.desirable, result.undesirable, result.too_long) == (6, 6, 0)
    assert (result.desirable_weight, result.undesirable_weight) == (1.0, 1.0)
    assert (Path(result.adapter_dir) / "adapter_config.json").is_file()
    assert margin(Path(result.adapter_dir)) > margin(sft) + 0.5


def test_the_tune_stage_skips_kto_with_one_line_when_there_are_no_thumbs(tmp_path: Path) -> None:
    """The DAG's tune task with `kto` and nothing rated: one line saying how many answers it has and needs, and the
    SFT adapter goes on. Mutation tried: the stage's kto branch removed (it runs DPO): the line names dpo, fails."""
    from pipelines.config import load_settings
    from pipelines.tune.stage import tune_stage

    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"sweep_id": "s1", "base_model": "tiny-llama", "prompt_style": "names"}))
    trained = {"sweep_uri": str(sweep), "adapter_dir": "/sft", "best_run_id": "r1"}
    lines: list[str] = []
    got = tune_stage(load_settings(root=str(tmp_path / "fw")), trained, "kto", progress=lines.append)
    assert got["adapter_dir"] == "/sft" and got["best_run_id"] == "r1" and "sft_adapter_dir" not in got
    assert got["tune"]["skipped"].startswith("kto: skipped: 0 desirable and 0 undesirable training answer(s)")
    assert "(tune.kto.min_rows)" in got["tune"]["skipped"] and lines == [got["tune"]["skipped"]]


def test_a_kto_version_names_what_trained_it_on_its_card_and_tags() -> None:
    """The model card's tuning section and the registry tags of a KTO-tuned version (mutation: the kto entry of
    `tune_lines` removed: the card calls it preference pairs and fails)."""
    from pipelines.registry.card import tune_lines, tune_tags

    by_source = {"down": {"train": 10}, "up": {"train": 30}}
    tune = {"method": "kto", "run_id": "r9", "rows": 40, "desirable": 30, "undesirable": 10, "steps": 12,
            "seconds": 8.5, "tokens": 900, "thumbs_by_source": by_source}  # fmt: skip
    card = "\n".join(tune_lines(tune))
    assert "40 rated answers, 30 desirable and 10 undesirable" in card and '"down": {"train": 10}' in card
    assert tune_tags(tune)["flywheel.tune_examples"] == "40" and tune_tags(tune)["flywheel.tune_method"] == "kto"


def test_a_bf16_tune_run_freezes_the_base_in_bf16_and_keeps_the_adapter_in_fp32(tmp_path: Path) -> None:
    """`bf16` (the tune stage's choice on a CPU with bf16 units, as SFT's): the policy's frozen base and the
    reference are cast to bf16 once, the trainable LoRA weights stay fp32; TRL autocasts, and recomputes no
    activations on the CPU. Mutation tried: `frozen_in` ignoring `bf16`: the base stays fp32 and it fails."""
    import torch

    from pipelines.tune.dpo import policy_and_reference, quiet_args

    base, sft = tiny_sft(tmp_path)
    model, _ = base()
    policy, reference = policy_and_reference(model, base, sft, bf16=True)
    trainable = {p.dtype for p in policy.parameters() if p.requires_grad}
    frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}
    args = quiet_args(0, bf16=True)
    assert args["bf16"] is True and args["gradient_checkpointing"] is torch.cuda.is_available()
    assert quiet_args(0, bf16=False)["bf16"] is False  # never TRL's default bf16 on a CPU that would emulate it
