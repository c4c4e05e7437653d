"""The GPU path of multi-LoRA serving: a model folder for the official Triton vLLM backend, whose engine serves
many LoRA adapters on one loaded base (requests pick one with the `lora_name` parameter). The CPU path of the
same idea is the Python model's shared-base mode (`triton_backend/model.py` with `lora_cache.py`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines.errors import NotRetryable

VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


class VllmConfigError(NotRetryable):
    """The adapters do not fit the vLLM model folder (a missing adapter, a rank above max_lora_rank)."""


def adapter_rank(adapter_dir: str) -> int:
    """The LoRA rank `r` of an HF-PEFT adapter folder (local or on object storage)."""
    from pipelines.storage import read_json

    try:
        return int(read_json(f"{adapter_dir.rstrip('/')}/adapter_config.json")["r"])
    except FileNotFoundError:
        raise VllmConfigError(f"{adapter_dir}: no adapter_config.json (not a PEFT adapter folder)") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise VllmConfigError(f"{adapter_dir}/adapter_config.json: no LoRA rank `r` ({exc})") from None


def vllm_model(
    out: Path,
    base_model: str,
    adapters: dict[str, str],
    max_lora_rank: int | None = None,
    gpu_memory_utilization: float = 0.85,
) -> Path:
    """A model folder for the official Triton vLLM container: base model with LoRA adapters by name
    (requests pick one with the `lora_name` parameter). Each adapter folder must exist and its rank
    fit `max_lora_rank` (default: the largest adapter rank, rounded up to a size vLLM accepts)."""
    ranks = {name: adapter_rank(path) for name, path in adapters.items()}
    needed = max(ranks.values(), default=8)
    if max_lora_rank is None:
        max_lora_rank = next((r for r in VLLM_LORA_RANKS if r >= needed), needed)
    too_big = {name: r for name, r in ranks.items() if r > max_lora_rank}
    if too_big:
        raise VllmConfigError(
            f"adapters {too_big} have a LoRA rank above max_lora_rank {max_lora_rank}: "
            f"vLLM would refuse them; raise max_lora_rank to at least {needed}"
        )
    if max_lora_rank not in VLLM_LORA_RANKS:
        raise VllmConfigError(f"max_lora_rank {max_lora_rank}: vLLM accepts one of {VLLM_LORA_RANKS}")
    (out / "1").mkdir(parents=True, exist_ok=True)
    (out / "1" / "model.json").write_text(
        json.dumps(
            {
                "model": base_model,
                "enable_lora": True,
                "max_lora_rank": max_lora_rank,
                "max_loras": max(1, len(adapters)),
                "gpu_memory_utilization": gpu_memory_utilization,
                "disable_log_requests": True,
            },
            indent=2,
        )
    )
    (out / "1" / "multi_lora.json").write_text(json.dumps(adapters, indent=2, sort_keys=True))
    (out / "config.pbtxt").write_text('backend: "vllm"\ninstance_group [ { count: 1 kind: KIND_MODEL } ]\n')
    return out
