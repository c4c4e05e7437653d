"""Small training inputs for backend tests: generated turns through the real prep function."""

from __future__ import annotations

from datetime import date
from functools import lru_cache

from pipelines.config import load_settings
from pipelines.logs.generator import GeneratorConfig, TrafficGenerator
from pipelines.prep.nodes import prepare_line
from pipelines.prep.prompt import chat_turns
from pipelines.train.hf_backend import TrainConfig
from pipelines.train.models import load_base


@lru_cache(maxsize=1)
def examples(n: int = 24) -> list[tuple[list[dict[str, str]], str]]:
    gen = TrafficGenerator(GeneratorConfig(seed=4, records=200, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [prepare_line(line) for _, line, _ in gen.lines()]
    rows = [r for r in rows if r["status"] == "clean" and r["turn_index"] == 0][:n]
    return [(chat_turns(r["system_prompt"], r["messages_json"]), r["target_json"]) for r in rows]


def tiny_config(**overrides) -> TrainConfig:
    base = {"base_model": "tiny-llama", "learning_rate": 5e-3, "warmup_steps": 2, "lora_rank": 8, "lora_alpha": 16,
            "batch_size": 4, "max_seq_len": 512, "checkpoint_every": 2, "seed": 1}
    return TrainConfig(**{**base, **overrides})


def tiny_loader(root: str):
    settings = load_settings(root=root)
    return lambda name: load_base(name, settings)
