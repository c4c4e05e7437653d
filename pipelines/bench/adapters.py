"""Synthetic LoRA adapters for serving benchmarks and tests: the shape a trained adapter has (the demo sweep's
rank and target modules), with random non-zero weights, so every adapter answers differently from the base and
from each other. What they say is meaningless; what they cost to hold and to run is what a trained one costs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # hf_backend's default


def make_adapters(
    base_path: str, out: Path, names: list[str], *, rank: int = 16, alpha: int = 32, seed: int = 0, scale: float = 1.0
) -> dict[str, Path]:
    """One HF-PEFT adapter folder per name under `out` (name -> folder), each seeded differently; `scale`
    multiplies the LoRA B weights (a larger value makes each adapter's answers further from the base's)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folders: dict[str, Path] = {}
    base: PreTrainedModel = AutoModelForCausalLM.from_pretrained(base_path, torch_dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(TARGETS), init_lora_weights=False, task_type="CAUSAL_LM"
    )
    for i, name in enumerate(names):
        torch.manual_seed(seed * 1000 + i)
        model = get_peft_model(base, config)
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "lora_B" in param_name:
                    param.mul_(scale)
        folder = out / name
        model.save_pretrained(str(folder))
        # the base without the LoRA layers, for the next adapter (peft types it as a plain nn.Module)
        base = cast("PreTrainedModel", model.unload())
        folders[name] = folder
    return folders
