"""Token budgets sized from the data and the model (`toolcall.budget`): the answer budget from the longest
training call, the prompt ceiling from the base model's context window, settings overriding both."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config import load_settings
from pipelines.toolcall.budget import budget_for, longest_in_tokens, prompt_ceiling, recorded

pytestmark = pytest.mark.usefixtures("flywheel_root")  # no FLYWHEEL_* setting of the user's shell leaks in


def test_the_answer_budget_is_the_longest_call_plus_a_margin() -> None:
    assert budget_for(57) == 80  # ceil(57 * 1.25) + 8: the demo's longest generated call
    assert budget_for(220) == 283  # a tau-bench retail call with an item list
    assert budget_for(0) == 16  # never below the floor
    assert recorded({"flywheel.answer_budget": "80"}) == 80 and recorded({}) is None


def test_the_longest_call_is_counted_in_the_base_models_tokens(tmp_path: Path) -> None:
    from pipelines.base_models import answer_budget_of, load_tokenizer

    settings = load_settings(root=str(tmp_path))
    tokenizer = load_tokenizer("smollm2-135m-instruct", settings)
    short = '{"name": "track_shipment", "arguments": {"order_id": "#W1"}}'
    long = (
        '{"name": "exchange_delivered_order_items", "arguments": {"item_ids": ['
        + ", ".join(f'"{n:010d}"' for n in range(12))
        + "]}}"
    )
    n = longest_in_tokens(tokenizer, [short, long, short])
    assert n == len(tokenizer(long, add_special_tokens=False)["input_ids"]) > 60
    assert answer_budget_of(settings, "smollm2-135m-instruct", [short, long]) == budget_for(n)
    assert longest_in_tokens(tokenizer, []) == 0


def test_the_prompt_ceiling_is_the_context_window_less_the_answer_budget() -> None:
    from pipelines.base_models import context_window

    assert context_window("smollm2-135m-instruct") == 8192 and context_window("tiny-llama") == 2048
    # a window whose longest target is 400 characters (~100 tokens): 8192 - (125 + 8)
    assert prompt_ceiling(8192, 400) == 8059
    assert prompt_ceiling(2048, 400) == 1915


def test_a_model_folder_takes_its_limits_from_the_version_unless_the_settings_say(tmp_path: Path) -> None:
    from pipelines.serve.repository import token_limits

    settings = load_settings(root=str(tmp_path))
    assert token_limits(settings, "smollm2-135m-instruct", 283) == (8192 - 283, 283)
    assert token_limits(settings, "smollm2-135m-instruct", None) == (8192 - 64, 64)  # registered without one
    fixed = load_settings(root=str(tmp_path), triton={"max_new_tokens": 40, "max_input_tokens": 1024})
    assert token_limits(fixed, "smollm2-135m-instruct", 283) == (1024, 40)
    from pipelines.config import ConfigError

    greedy = load_settings(root=str(tmp_path), triton={"max_new_tokens": 2040})
    with pytest.raises(ConfigError, match="leaves 8 of tiny-llama's 2048-token context window"):
        token_limits(greedy, "tiny-llama", 283)  # a folder that would refuse every prompt is never built
    assert token_limits(greedy, "smollm2-135m-instruct", 283) == (8192 - 2040, 2040)


def test_a_model_folder_names_its_own_context_window(tmp_path: Path) -> None:
    import json

    from pipelines.base_models import context_window

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    assert context_window(str(tmp_path)) == 4096


def test_the_gates_ceiling_uses_the_runs_own_sweep_and_survives_a_broken_one(tmp_path: Path) -> None:
    from pipelines.tasks import base_context_window

    tiny = str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "tiny.yaml")
    settings = load_settings(root=str(tmp_path), train={"sweep": tiny})  # configured: tiny-llama's 2,048
    assert base_context_window(settings) == 2048
    assert base_context_window(load_settings(root=str(tmp_path))) == 8192  # the default sweep: SmolLM2
    demo = str(Path(__file__).resolve().parent.parent / "conf" / "sweeps" / "demo.yaml")
    assert base_context_window(settings, {"sweep": demo}) == 8192  # the run's own sweep wins
    for text in ("base: [unclosed", "- a list\n- not a sweep\n"):
        broken = tmp_path / "broken.yaml"
        broken.write_text(text)
        assert base_context_window(settings, {"sweep": str(broken)}) == 8192  # SmolLM2's: the train task says why


def test_the_quality_gate_ceiling_follows_the_longest_target_unless_set(tmp_path: Path, spark) -> None:
    from pipelines.quality.gates import ceiling_of

    examples = spark.createDataFrame([("a" * 400,), ("b" * 40,)], "target_json string")
    auto = ceiling_of(load_settings(root=str(tmp_path)), examples, 8192)
    assert auto == {
        "max_approx_tokens": 8059,
        "source": "context window - answer budget",
        "context_window": 8192,
        "longest_target_chars": 400,
    }
    fixed = ceiling_of(load_settings(root=str(tmp_path), quality={"max_approx_tokens": 4096}), examples, 8192)
    assert fixed == {"max_approx_tokens": 4096, "source": "quality.max_approx_tokens"}


def test_budget_settings_are_unset_by_default(tmp_path: Path) -> None:
    settings = load_settings(root=str(tmp_path))
    assert settings.evaluation.max_new_tokens is None and settings.triton.max_new_tokens is None
    assert settings.triton.max_input_tokens is None and settings.quality.max_approx_tokens is None
