"""GRPO after SFT (issue 51, item 3): the scorer's reward, its failures, and GRPO on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from pipelines.config.tune import GrpoSettings
from pipelines.tune.grpo import answer_text, reward_function
from pipelines.tune.reward import BEST, WRONG_WRITE, RewardError, reward, rewards

EFFECTS = {"get_order": "read", "cancel_order": "write", "refund": "write"}
CANCEL = {"name": "cancel_order", "arguments": {"order_id": "#W1", "reason": "no longer needed"}}
ORDER = {"name": "get_order", "arguments": {"order_id": "#W1"}}


def _text(call: dict[str, Any]) -> str:
    return json.dumps(call)


def test_a_wrong_write_is_worse_than_any_other_answer_and_the_exact_call_best() -> None:
    """Mutations tried: WRONG_WRITE set to 0 (a wrong write as bad as gibberish): the first assertion fails; the
    wrong-write branch removed (a right tool on other ids earns its name and argument gains): fails; EXACT's gain
    dropped: the exact call earns less than BEST: fails."""
    answers = {
        "exact": _text(CANCEL),
        "near": _text({"name": "cancel_order", "arguments": {"order_id": "#W1", "reason": "ordered by mistake"}}),
        "other_read": _text(ORDER),
        "abstain": _text({"name": None}),
        "gibberish": "I will cancel it for you",
        "other_ids": _text({"name": "cancel_order", "arguments": {"order_id": "#W2", "reason": "no longer needed"}}),
        "other_write": _text({"name": "refund", "arguments": {"order_id": "#W1"}}),
    }
    got = {k: reward(v, CANCEL, EFFECTS, "r1") for k, v in answers.items()}
    worst_fine = min(v for k, v in got.items() if k not in ("other_ids", "other_write"))
    assert got["other_ids"] == got["other_write"] == WRONG_WRITE < worst_fine
    assert got["exact"] == pytest.approx(BEST) and got["exact"] > got["near"] > got["other_read"] >= 0
    assert got["gibberish"] == 0.0
    # a write where a read was expected is a wrong write too, whatever else it gets right
    assert reward(_text(CANCEL), ORDER, EFFECTS, "r2") == WRONG_WRITE


def test_abstaining_where_no_tool_fits_is_rewarded_as_the_exact_call() -> None:
    """Mutation tried: the abstention branch removed (an expected abstention scored by argument gains): a right
    abstention earns less than BEST and the first assertion fails."""
    nothing = {"name": None}
    assert reward(_text(nothing), nothing, EFFECTS, "a") == pytest.approx(BEST)
    assert reward(_text(ORDER), nothing, EFFECTS, "a") == 0.0
    assert reward(_text(CANCEL), nothing, EFFECTS, "a") == WRONG_WRITE


def test_a_scorer_failure_fails_at_once_with_the_prompt_id_never_a_silent_zero() -> None:
    """Mutations tried: the reward's try/except returning 0.0 instead of raising: no RewardError, fails; the
    record id left out of the message: the match fails."""
    broken = {"name": "get_order", "arguments": ["#W1"]}  # arguments not an object: the scorer cannot read them
    with pytest.raises(RewardError, match="prompt rec-7"):
        reward(_text(ORDER), broken, EFFECTS, "rec-7")
    with pytest.raises(RewardError, match="2 answers for 1"):
        rewards(["a", "b"], [ORDER], ["x"])
    fn = reward_function(EFFECTS)  # TRL's reward function: an expected call that does not parse names its prompt
    with pytest.raises(RewardError, match="prompt rec-9"):
        fn(prompts=[[]], completions=[[{"role": "assistant", "content": "{}"}]], record_id=["rec-9"],
           expected=["not json"])  # fmt: skip
    logged: dict[str, float] = {}
    got = fn(
        prompts=[[], []],
        completions=[[{"role": "assistant", "content": _text(ORDER)}], _text(CANCEL)],
        record_id=["a", "b"],
        expected=[_text(ORDER), _text(ORDER)],
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    assert got == [pytest.approx(BEST), WRONG_WRITE]
    assert logged == {"toolcall/wrong_write_rate": 0.5, "toolcall/exact_rate": 0.5, "toolcall/valid_rate": 1.0}
    assert answer_text([{"role": "assistant", "content": "x"}]) == "x"


@pytest.mark.slow
def test_grpo_trains_the_sft_adapter_on_answers_sampled_under_the_grammar(tmp_path: Path) -> None:
    """GRPO on the tiny model (random weights): every sampled answer is decoded under its prompt's grammar, so
    every one parses as a call; the adapter's weights move; TRL's frozen "ref" copy is not saved. Mutations tried:
    `constrained` ignored (answers decoded freely): the valid share drops to 0 and the test fails; the SFT adapter
    loaded frozen (is_trainable=False): no weight moves and the test fails."""
    from safetensors.torch import load_file
    from test_tune import TRACK, _example, tiny_sft

    from pipelines.errors import DataProblem
    from pipelines.toolcall.examples import grounded_tools, to_examples
    from pipelines.tune.grpo import prompt_rows, train_grpo

    base, sft = tiny_sft(tmp_path)
    _, tokenizer = base()
    frame = pd.DataFrame(
        [_example(f"r{i}", ORDER if i % 2 else TRACK, "teacher", f"where is #W{i}?") for i in range(6)]
    )
    examples = to_examples(frame, "short")
    cfg = GrpoSettings(max_steps=2, group_size=2, prompts_per_step=2, learning_rate=1e-3, max_prompt_tokens=32)
    rows, too_long = prompt_rows(examples, grounded_tools(examples, None), tokenizer, cfg)
    assert rows == [] and too_long == 6  # too long for 32 tokens: left out, counted
    rows, too_long = prompt_rows(examples, grounded_tools(examples, None), tokenizer, GrpoSettings())
    assert too_long == 0 and [r["record_id"] for r in rows] == [f"r{i}" for i in range(6)]
    tools = grounded_tools(examples, None)
    with pytest.raises(DataProblem, match="no training prompt fits max_prompt_tokens 32 .6 longer"):
        train_grpo(examples, tools, cfg, sft, tmp_path / "none", base, max_new_tokens=24, constrained=True)
    cfg = cfg.model_copy(update={"max_prompt_tokens": 1536})
    result = train_grpo(examples, tools, cfg, sft, tmp_path / "grpo", base, max_new_tokens=24, constrained=True)
    assert result.steps == 2 and len(result.losses) == 2 and len(result.rewards) == 2 and result.tokens > 0
    assert result.valid == [1.0, 1.0] and result.prompts == 6 and result.too_long == 0
    before = load_file(sft / "adapter_model.safetensors")
    after = load_file(Path(result.adapter_dir) / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert any(not (before[k] == after[k]).all() for k in before)
    assert not (Path(result.adapter_dir) / "ref").exists()


def test_the_nemo_rl_export_is_in_its_formats_and_names_the_same_reward() -> None:
    """DPO records in BinaryPreferenceDataset's keys (the prompt a message list, system first, its sides the call
    texts), GRPO records with gold answers that parse to the expected call, the environment naming the function
    that scores here, and the pod plan. Mutations tried: `chosen` and `rejected` swapped in `dpo_records`: the
    chosen side check fails; the environment's reward path misspelled: the import fails; the init container
    dropped: the pod check fails."""
    import importlib

    from test_tune import TRACK, _example

    from pipelines.cluster.training import nemo_rl_pod
    from pipelines.config import load_settings
    from pipelines.toolcall.calls import parse_call
    from pipelines.toolcall.examples import to_examples
    from pipelines.tune.dpo import preference_rows
    from pipelines.tune.nemo_rl import (
        DPO_KEYS,
        TASK,
        dpo_overrides,
        dpo_records,
        environment,
        grpo_overrides,
        grpo_records,
        model_name,
    )

    pairs = pd.DataFrame(
        [{**_example("p1", ORDER, "teacher"), "chosen_json": json.dumps(ORDER), "rejected_json": json.dumps(TRACK)}]
    )
    (dpo,) = dpo_records(preference_rows(pairs, "short"))
    assert set(dpo) == {"prompt", "chosen_response", "rejected_response"}
    assert dpo["prompt"][0]["role"] == "system" and dpo["prompt"][-1] == {"role": "user", "content": "where is #W1?"}
    assert parse_call(dpo["chosen_response"]) == ORDER and parse_call(dpo["rejected_response"]) == TRACK
    cfg = dpo_overrides(
        model_name("llama-3.1-nemotron-nano-8b-v1"), "/export/dpo_train.jsonl", load_settings().tune.dpo
    )
    assert cfg["data"] == {"dataset_name": "BinaryPreferenceDataset", "train_data_path": "/export/dpo_train.jsonl",
                           **DPO_KEYS}  # fmt: skip
    assert (
        cfg["policy"]["model_name"]
        == "nvidia/Llama-3.1-Nemotron-Nano-8B-v1"
        == model_name("llama-3.1-nemotron-nano-8b-v1")
    )
    examples = to_examples(pd.DataFrame([_example("g1", ORDER, "teacher")]), "short")
    (grpo,) = grpo_records(examples, [examples[0].tools])
    assert json.loads(grpo["gold_answers"]) == [ORDER] and grpo["task_name"] == TASK and grpo["record_id"] == "g1"
    settings = load_settings()
    over = grpo_overrides("smollm2-135m-instruct", "/export/grpo_prompts.jsonl", settings.tune.grpo, 48)
    assert over["grpo"]["num_generations_per_prompt"] == settings.tune.grpo.group_size
    assert over["loss_fn"]["reference_policy_kl_penalty"] == settings.tune.grpo.kl_beta
    assert over["policy"]["generation"]["max_new_tokens"] == 48
    env = environment(EFFECTS)
    module, name = env["reward"].split(":")
    scored = getattr(importlib.import_module(module), name)
    assert scored(_text(ORDER), ORDER, env["effects"], "g1") == pytest.approx(sum(env["weights"].values()))
    assert scored(_text(CANCEL), ORDER, env["effects"], "g1") == env["wrong_write"]
    pod = nemo_rl_pod(settings, method="grpo", export_uri="s3://runs/tune/export/grpo-v3", run_name="v3", gpus=8)
    (fetch,) = pod["spec"]["initContainers"]
    assert (
        fetch["command"][-1] == "s3://runs/tune/export/grpo-v3" and fetch["image"] == settings.kubernetes.training_image
    )
    (main,) = pod["spec"]["containers"]
    assert main["image"] == settings.kubernetes.nemo_rl_image and main["command"][:3] == [
        "uv",
        "run",
        "examples/run_grpo.py",
    ]
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "8"} and "env" not in main  # no value in the spec
    with pytest.raises(ValueError, match="method"):
        nemo_rl_pod(settings, method="kto", export_uri="x", run_name="v3", gpus=1)


def test_the_tune_stage_carries_the_sft_adapter_on_when_it_cannot_tune_here() -> None:
    """Off: the sweep's result as it is; a runs zone on object storage: skipped with one line, the SFT adapter
    carried on, nothing read. Mutation tried: the non-local check removed: the stage reads the sweep file on S3
    and fails."""
    from pipelines.config import load_settings
    from pipelines.tune.stage import tune_stage

    trained = {"sweep_uri": "s3://nowhere/sweep.json", "adapter_dir": "/sft", "best_run_id": "r1"}
    assert tune_stage(load_settings(), trained, "off") == {**trained, "tune": {"method": "off"}}
    lines: list[str] = []
    cluster = load_settings().model_copy(update={"root": "s3://flywheel-runs/root"})  # the zones on S3
    got = tune_stage(cluster, trained, "grpo", progress=lines.append)
    assert got["adapter_dir"] == "/sft" and got["best_run_id"] == "r1" and "sft_adapter_dir" not in got
    assert got["tune"]["skipped"].startswith("grpo: skipped: the runs zone is not on this machine")
    assert lines == [got["tune"]["skipped"]]
