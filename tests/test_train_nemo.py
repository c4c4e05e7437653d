"""The nemo backend: NeMo AutoModel's own fine-tuning recipe (CPU adaptation here) from our generated
recipe YAML, ending in an adapter that stock `peft` loads. Needs `make nemo-env` (make test creates it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_data import examples, tiny_config, tiny_loader

from pipelines.config import load_settings
from pipelines.train.nemo_backend import recipe, target_patterns, train_nemo


def test_recipe_carries_the_sweep_hyperparameters() -> None:
    cfg = tiny_config(
        learning_rate=3e-4,
        optimizer="adam",
        warmup_steps=7,
        min_lr_ratio=0.1,
        lora_rank=32,
        lora_alpha=64,
        lora_layers=2,
        max_steps=50,
        checkpoint_every=10,
    )
    spec = recipe(
        cfg,
        base_model_path="/m",
        num_layers=30,
        train_file="/d.jsonl",
        checkpoint_dir="/c",
        examples=100,
        gpus=8,
        tensor_parallel_size=2,
    )
    assert spec["optimizer"]["_target_"] == "torch.optim.Adam" and spec["optimizer"]["lr"] == 3e-4
    assert spec["lr_scheduler"] == {"lr_decay_style": "cosine", "lr_warmup_steps": 7, "min_lr": pytest.approx(3e-5)}
    assert spec["peft"]["dim"] == 32 and spec["peft"]["alpha"] == 64
    assert spec["peft"]["target_modules"][0] == "*.layers.28.*.q_proj" and len(spec["peft"]["target_modules"]) == 14
    assert spec["distributed"]["tp_size"] == 2 and spec["distributed"]["dp_size"] == 4
    assert spec["step_scheduler"]["max_steps"] == 50 and spec["step_scheduler"]["ckpt_every_steps"] == 10
    assert spec["dist_env"]["backend"] == "nccl" and spec["model"]["torch_dtype"] == "bfloat16"
    cpu = recipe(cfg, base_model_path="/m", num_layers=30, train_file="/d.jsonl", checkpoint_dir="/c", examples=100)
    assert cpu["dist_env"]["backend"] == "gloo" and cpu["model"]["torch_dtype"] == "float32"
    assert "mp_policy" not in spec["distributed"]  # the GPU keeps AutoModel's bf16 compute policy
    assert target_patterns(tiny_config(), 2) == [f"*.{m}" for m in tiny_config().target_modules]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory):
    """One unpacked NeMo training (3 steps, the top layer, 4 examples) that the recipe and packing tests share
    (each run costs about a minute here)."""
    folder = tmp_path_factory.mktemp("nemo")
    settings = load_settings(root=str(folder / "root"))
    assert Path(settings.train.nemo_python).is_file(), "run `make nemo-env` (make test does)"
    steps: list[tuple[int, float]] = []
    result = train_nemo(
        settings,
        tiny_config(max_steps=3, lora_layers=1),
        examples(4),
        folder / "plain",
        lambda step, loss, lr: steps.append((step, lr)),
    )
    return folder, result, steps


def test_nemo_recipe_trains_a_lora_adapter_stock_peft_loads(plain_run) -> None:
    from peft import PeftModel

    folder, result, steps = plain_run
    assert result.status == "completed" and result.steps == 3 and [s for s, _ in steps] == [0, 1, 2]
    assert steps[1][1] == pytest.approx(5e-3) and steps[-1][1] < steps[1][1]  # warmup to the LR, cosine down
    assert (folder / "plain" / "nemo-recipe.yaml").is_file()
    base, tokenizer = tiny_loader(str(folder / "root"))("tiny-llama")
    ids = tokenizer("track my order ORD-1234567890", return_tensors="pt").input_ids
    with torch.no_grad():
        before = base(ids).logits
    tuned = PeftModel.from_pretrained(base, result.adapter_dir)
    targets = tuned.peft_config["default"].target_modules
    assert all("layers.1." in t for t in targets), targets  # lora_layers=1: the top layer only
    with torch.no_grad():
        after = tuned(ids).logits
    assert not torch.allclose(before, after), "the trained adapter changes the model"
    # on CPU the recipe computes in the model's fp32 (AutoModel's default policy would cast the frozen base and
    # the adapter to bf16: torch's slow fallback bf16 GEMM on CPU, and a bf16 adapter)
    from safetensors import safe_open

    with safe_open(str(Path(result.adapter_dir) / "adapter_model.safetensors"), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    assert dtypes == {"F32"}, dtypes


def test_nemo_packs_the_examples_with_automodel_s_own_packing(tmp_path: Path, plain_run) -> None:
    """`packed_seq_len` reaches AutoModel as its `packed_sequence` block and the recipe trains on the packed
    rows. With each step's examples in one pack (4 examples of ~500 tokens, batch 4), the packed run trains
    what the unpacked one does: the same loss at every step (prompt tokens masked in the pack, each example
    attending only to itself, the loss normalized over the same tokens)."""
    import yaml

    settings = load_settings(root=str(tmp_path / "root"))
    data = examples(4)
    packed = train_nemo(
        settings, tiny_config(max_steps=3, lora_layers=1, packed_seq_len=4096), data, tmp_path / "packed"
    )
    spec = yaml.safe_load((tmp_path / "packed" / "nemo-recipe.yaml").read_text())
    assert spec["packed_sequence"]["packed_sequence_size"] == 4096
    assert spec["step_scheduler"]["global_batch_size"] == 1 and spec["step_scheduler"]["max_steps"] == 3
    assert packed.status == "completed" and packed.steps == 3
    log = (tmp_path / "packed" / "nemo-train.log").read_text()
    assert "NEAT-packing dataset with size: 4096" in log, "AutoModel packed the dataset itself"
    _, plain, _ = plain_run  # the same examples, unpacked
    assert plain.status == "completed" and plain.steps == 3
    # the recipe logs 4 decimals: equal runs differ by <= 1e-4 here; letting a pack's examples attend to each
    # other (AutoModel's block-causal mask made plain causal) moved this random tiny model's losses by 7e-4 to 3e-3
    assert packed.losses == pytest.approx(plain.losses, abs=4e-4), (packed.losses, plain.losses)


def test_a_recipe_whose_epochs_run_out_before_max_steps_is_an_error_not_a_short_completed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AutoModel ends at num_epochs even before max_steps; a run that trained fewer steps than its schedule
    says so (one error naming the step), never reports itself completed."""
    from pipelines.train import nemo_backend

    monkeypatch.setattr(nemo_backend, "epochs_to_cover", lambda *_: 1)  # 8 examples, batch 4: 2 steps an epoch
    settings = load_settings(root=str(tmp_path / "root"))
    with pytest.raises(nemo_backend.NemoUnavailable, match="stopped at step 2 of 3"):
        train_nemo(settings, tiny_config(max_steps=3, lora_layers=1, warmup_steps=0), examples(8), tmp_path / "run")
