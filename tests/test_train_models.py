"""Base-model catalogue: the tiny test model and the packaged SmolLM2, no hub access."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipelines.base_models import CATALOGUE, ModelUnavailable, load_base, prepare_base
from pipelines.config import load_settings


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory):
    return load_settings(root=str(tmp_path_factory.mktemp("models")))


def test_catalogue_lists_the_case_study_model() -> None:
    assert CATALOGUE["llama-3.1-nemotron-nano-8b-v1"].reference == "nvidia/Llama-3.1-Nemotron-Nano-8B-v1"


def test_tiny_llama_is_deterministic_and_uses_a_real_tokenizer(settings) -> None:
    model, tokenizer = load_base("tiny-llama", settings)
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    ids = tokenizer("track order ORD-123", return_tensors="pt").input_ids
    with torch.no_grad():
        first = model(ids).logits
    again, _ = load_base("tiny-llama", settings)
    with torch.no_grad():
        assert torch.equal(first, again(ids).logits)


def test_hub_models_are_an_explicit_error_without_a_hub(settings, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read once, when huggingface_hub is first imported: set the
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # constant too (no 46 s of retries)
    with pytest.raises(ModelUnavailable, match="llama-3.1-nemotron-nano-8b-v1"):
        load_base("llama-3.1-nemotron-nano-8b-v1", settings)


@pytest.mark.slow
def test_smollm2_is_dequantized_once_and_cached_as_safetensors(settings) -> None:
    path = Path(prepare_base("smollm2-135m-instruct", settings))
    assert list(path.glob("*.safetensors")) and "quantization_config" not in (path / "config.json").read_text()
    model, tokenizer = load_base("smollm2-135m-instruct", settings)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert next(model.parameters()).dtype == torch.float32
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hi"}], tokenize=False, add_generation_prompt=True
    )
    out = model.generate(**tokenizer(prompt, return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape[1] > len(tokenizer(prompt).input_ids)
