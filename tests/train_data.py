"""Small training inputs for backend tests: generated turns through the real prep function."""

from __future__ import annotations

import json
from datetime import date
from functools import lru_cache
from pathlib import Path

from pipelines.base_models import load_base
from pipelines.config import load_settings
from pipelines.prep.nodes import prepare_line
from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator
from pipelines.toolcall.prompt import chat_turns
from pipelines.train.hf_backend import TrainConfig


@lru_cache(maxsize=1)
def examples(n: int = 24) -> list[tuple[list[dict[str, str]], str]]:
    gen = TrafficGenerator(GeneratorConfig(seed=4, records=200, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [prepare_line(line) for _, line, _ in gen.lines()]
    rows = [r for r in rows if r["status"] == "clean" and r["turn_index"] == 0][:n]
    return [(chat_turns(r["system_prompt"], r["messages_json"]), r["target_json"]) for r in rows]


def tiny_config(**overrides) -> TrainConfig:
    base = {
        "base_model": "tiny-llama",
        "learning_rate": 5e-3,
        "warmup_steps": 2,
        "lora_rank": 8,
        "lora_alpha": 16,
        "batch_size": 4,
        "max_seq_len": 512,
        "checkpoint_every": 2,
        "seed": 1,
    }
    return TrainConfig(**{**base, **overrides})


def tiny_loader(root: str):
    settings = load_settings(root=root)
    return lambda name: load_base(name, settings)


def write_training_set(root: Path, records: int = 400, seed: int = 4) -> dict:
    """A small curated SFT set + manifest in the layout the features stage writes (the real stage is
    tested with Spark and Feast in test_quality_features / test_dag; training tests need seconds)."""
    import hashlib

    import pandas as pd

    gen = TrafficGenerator(GeneratorConfig(seed=seed, records=records, bad_share=0.0, end_date=date(2026, 11, 20)))
    rows = [prepare_line(line) for _, line, _ in gen.lines()]
    frame = pd.DataFrame([r for r in rows if r["status"] == "clean"])
    frame["event_timestamp"] = pd.to_datetime(frame["event_time"], utc=True)
    frame["context"] = ""
    frame["split"] = [
        ("train", "train", "train", "val", "test")[int(h, 16) % 5]
        for h in frame["session_id"].map(lambda s: hashlib.sha1(s.encode()).hexdigest()[:6])
    ]
    files, h = [], hashlib.sha256()
    for split, group in frame.groupby("split"):
        target = root / "curated" / "sft" / f"split={split}" / "dt=2026-11-20"
        target.mkdir(parents=True, exist_ok=True)
        path = target / "part-0.parquet"
        group.drop(columns=["split"]).to_parquet(path, index=False)
        files.append(str(path))
        h.update(path.read_bytes())
    manifest = {
        "window": {"start": "2026-11-20", "end": "2026-11-20"},  # the features stage's shape
        "training_set": {
            "uri": str(root / "curated" / "sft"),
            "files": sorted(files),
            "digest": h.hexdigest(),
            "examples_by_split": frame["split"].value_counts().to_dict(),
        },
        "label_sources": {k: int(v) for k, v in frame["label_source"].value_counts().items()},
    }
    (root / "curated" / "manifest.json").write_text(json.dumps(manifest))
    (root / "curated" / "manifests").mkdir(parents=True, exist_ok=True)  # the window's own manifest, as features
    (root / "curated" / "manifests" / "2026-11-20_2026-11-20.json").write_text(json.dumps(manifest))
    return manifest
