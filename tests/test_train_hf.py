"""The hf LoRA backend on the tiny model: schedule, learning, adapter format, divergence, resume after kill."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_data import examples, tiny_config, tiny_loader

from pipelines.train.hf_backend import (
    CHECKPOINT_FILES,
    _target_loss,
    cosine_lr,
    encode,
    last_checkpoint,
    pack_rows,
    packed_batch,
    padded_batch,
    train_lora,
)

STEPS = 8


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("hf-models"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, model_root: str):
    out = tmp_path_factory.mktemp("hf-run")
    return out, train_lora(examples(), tiny_config(max_steps=STEPS), out, tiny_loader(model_root))


def test_cosine_schedule_with_warmup_hand_computed() -> None:
    cfg = tiny_config(learning_rate=1.0, warmup_steps=2, min_lr_ratio=0.1)
    assert [round(cosine_lr(s, 12, cfg), 4) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert cosine_lr(11, 12, cfg) == pytest.approx(0.1)
    assert cosine_lr(2 + 9 / 2, 12, cfg) == pytest.approx(0.55)  # half way down: floor + half the range


def test_loss_is_on_the_target_only(model_root: str) -> None:
    _, tokenizer = tiny_loader(model_root)("tiny-llama")
    turns, target = examples()[0]
    ids, labels = encode(tokenizer, turns, target, 512)
    supervised = [t for t, label in zip(ids, labels) if label != -100]
    assert tokenizer.decode(supervised) == target + tokenizer.eos_token
    assert labels[0] == -100 and len(ids) == len(labels)


def test_training_learns_and_writes_a_peft_adapter(trained) -> None:
    out, result = trained
    assert result.status == "completed" and result.steps == STEPS and result.resumed_from == 0
    assert sum(result.losses[-2:]) / 2 < result.losses[0]
    assert result.learning_rates[1] > result.learning_rates[0] and result.learning_rates[-1] < max(
        result.learning_rates
    )
    files = {p.name for p in Path(result.adapter_dir).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert not (out / "checkpoint").exists()
    assert result.tokens > 0 and result.tokens_per_s > 0


def test_stock_peft_reproduces_training_time_logits(trained, model_root: str) -> None:
    from peft import PeftModel

    _, result = trained
    load = tiny_loader(model_root)
    base, tokenizer = load("tiny-llama")
    tuned = PeftModel.from_pretrained(base, result.adapter_dir).eval()
    ids = torch.tensor([encode(tokenizer, *examples()[0], 512)[0]])
    merged_base, _ = load("tiny-llama")
    plain = merged_base.eval()
    with torch.no_grad():
        tuned_logits = tuned(ids).logits
        base_logits = plain(ids).logits
        merged = tuned.merge_and_unload()(ids).logits
    assert not torch.allclose(tuned_logits, base_logits), "the adapter changes the model"
    assert torch.allclose(tuned_logits, merged, atol=1e-5), "merged weights give the same logits"
    # the adapter saved at the end is what training produced: a second load gives identical logits
    again = PeftModel.from_pretrained(load("tiny-llama")[0], result.adapter_dir).eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, tuned_logits)


def test_diverging_variant_stops_early(tmp_path: Path, model_root: str) -> None:
    load = tiny_loader(model_root)
    calls = {"n": 0}

    def exploding(name: str):
        model, tokenizer = load(name)

        def scale(_module, _inputs, output):  # logits blow up a little more at every step
            calls["n"] += 1
            return output * 10.0 ** calls["n"]

        model.lm_head.register_forward_hook(scale)
        return model, tokenizer

    result = train_lora(examples(), tiny_config(max_steps=STEPS), tmp_path, exploding)
    assert result.status == "diverged" and result.steps < STEPS
    assert result.losses[-1] > 4 * result.losses[0]
    assert (tmp_path / "adapter" / "adapter_config.json").is_file(), "the last good state is still saved"


@pytest.mark.slow
def test_killed_run_resumes_and_ends_with_the_same_adapter(trained, tmp_path: Path, model_root: str) -> None:
    from safetensors.torch import load_file

    worker = [sys.executable, str(Path(__file__).with_name("train_worker.py")), str(tmp_path), model_root, str(STEPS)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(worker, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and _checkpoint_step(tmp_path) < 4:
        assert proc.poll() is None, "the run finished before it could be killed"
        time.sleep(0.05)
    assert _checkpoint_step(tmp_path) >= 4, "no checkpoint at step 4 within 300 s"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # the kill as it lands between a save's two renames: the last checkpoint moved aside, the next not yet in
    if (tmp_path / "checkpoint").exists():
        shutil.rmtree(tmp_path / "checkpoint.old", ignore_errors=True)
        os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.old")
    resumed = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=600, check=True)
    result = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert result["resumed_from"] >= 4 and result["steps"] == STEPS
    assert not [p.name for p in tmp_path.glob("checkpoint*")], "a finished run leaves no checkpoint behind"
    _, uninterrupted = trained
    a = load_file(str(Path(uninterrupted.adapter_dir) / "adapter_model.safetensors"))
    b = load_file(str(Path(result["adapter_dir"]) / "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6), key
    assert result["losses"] == pytest.approx(uninterrupted.losses, abs=1e-5)


def _checkpoint_step(out_dir: Path) -> int:
    """The step of the run's last checkpoint, -1 while none (the run may swap it in while this reads)."""
    found = last_checkpoint(out_dir)
    try:
        return json.loads((found / "state.json").read_text())["step"] if found else -1
    except FileNotFoundError:
        return -1


def _fill(folder: Path, files=CHECKPOINT_FILES) -> None:
    folder.mkdir(exist_ok=True)
    for name in files:
        (folder / name).write_text("{}")


def test_a_resume_finds_the_checkpoint_a_kill_left_aside(tmp_path: Path) -> None:
    assert last_checkpoint(tmp_path) is None
    _fill(tmp_path / "checkpoint.tmp")
    _fill(tmp_path / "checkpoint.old", ["state.json"])  # a kill while it was being removed
    assert last_checkpoint(tmp_path) is None, "one not yet swapped in, or one missing files, is no checkpoint"
    _fill(tmp_path / "checkpoint.old")
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint.old"
    _fill(tmp_path / "checkpoint")
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint", "the newer one first"


def test_a_save_keeps_the_checkpoint_a_resume_started_from_until_the_next_is_in(
    tmp_path: Path, model_root: str, monkeypatch
) -> None:
    from peft import LoraConfig, get_peft_model

    from pipelines.train import hf_backend

    model, _ = tiny_loader(model_root)("tiny-llama")
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    hf_backend._save_checkpoint(model, optimizer, scheduler, tmp_path / "checkpoint", 2, [1.0, 0.9], [0.1, 0.1], 8)
    os.replace(tmp_path / "checkpoint", tmp_path / "checkpoint.old")  # a resume from the one a kill left aside
    real = os.replace

    def killed_before_the_move_in(src, dst):
        if Path(dst).name == "checkpoint":
            raise OSError("killed")
        real(src, dst)

    monkeypatch.setattr(hf_backend.os, "replace", killed_before_the_move_in)
    with pytest.raises(OSError, match="killed"):
        hf_backend._save_checkpoint(model, optimizer, scheduler, tmp_path / "checkpoint", 4, [1.0] * 4, [0.1] * 4, 16)
    monkeypatch.undo()
    assert last_checkpoint(tmp_path) == tmp_path / "checkpoint.old"
    assert json.loads((tmp_path / "checkpoint.old" / "state.json").read_text())["step"] == 2


def test_a_finished_run_leaves_no_checkpoint_folder(tmp_path: Path, model_root: str) -> None:
    _fill(tmp_path / "checkpoint.old", ["state.json"])  # what kills left: no whole checkpoint among them
    _fill(tmp_path / "checkpoint.tmp")
    result = train_lora(examples()[:4], tiny_config(max_steps=1), tmp_path, tiny_loader(model_root))
    assert result.resumed_from == 0 and result.steps == 1
    assert not [p.name for p in tmp_path.glob("checkpoint*")]


def test_first_fit_decreasing_packing_by_hand() -> None:
    # longest first: 7 opens row 0, 6 row 1, 5 row 2; 3 fits row 0 (room 3), 2 row 1 (room 4), 2 row 1 again
    assert pack_rows([2, 7, 3, 6, 5, 2], 10) == [[1, 2], [3, 0, 5], [4]]
    assert pack_rows([4, 4, 4], 12) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows([5, 13], 12)


def test_a_packed_step_has_the_loss_of_the_same_examples_padded(model_root: str) -> None:
    """Packing changes the layout, not the step: the same examples give the same target loss, because no
    example attends to another (position ids restart per example) and the padding carries no label."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = tiny_loader(model_root)("tiny-llama")
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    ).eval()
    rows = [encode(tokenizer, turns, target, 512) for turns, target in examples()[:6]]
    padded = padded_batch(rows, tokenizer.pad_token_id or 0)
    packed = packed_batch(rows, 1024, tokenizer.pad_token_id or 0)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0], "several examples share a row"
    assert int(packed["attention_mask"].sum()) == int(padded["attention_mask"].sum()), "no token lost or added"
    with torch.no_grad():
        want, got = _target_loss(model, padded), _target_loss(model, packed)
        # the same rows laid end to end with running positions: the later examples see the earlier ones
        leaky = {**packed, "position_ids": torch.arange(packed["input_ids"].shape[1]).expand_as(packed["input_ids"])}
        lengths = [len(ids) for ids, _ in rows]
        states = {
            name: _example_states(model, batch, lengths, packed=name != "padded")
            for name, batch in (("padded", padded), ("packed", packed), ("leaky", leaky))
        }
    assert float(got) == pytest.approx(float(want), abs=1e-4)
    assert torch.allclose(states["packed"], states["padded"], atol=1e-4)
    assert (states["leaky"] - states["padded"]).abs().max() > 1e-2, "the check can tell a leaking pack from a clean one"


def _example_states(model, batch, lengths: list[int], packed: bool) -> torch.Tensor:
    """The decoder's output at every real token, example after example in input order, whatever the layout."""
    inputs = {"position_ids": batch["position_ids"]} if packed else {"attention_mask": batch["attention_mask"]}
    hidden = (
        model.get_base_model().get_decoder()(input_ids=batch["input_ids"], use_cache=False, **inputs).last_hidden_state
    )
    where = {i: (i, 0) for i in range(len(lengths))}
    if packed:
        for r, group in enumerate(pack_rows(lengths, 1024)):
            at = 0
            for i in group:
                where[i], at = (r, at), at + lengths[i]
    return torch.cat([hidden[where[i][0], where[i][1] : where[i][1] + n] for i, n in enumerate(lengths)])


def test_packed_training_runs_the_same_schedule(model_root: str, tmp_path: Path) -> None:
    result = train_lora(examples(), tiny_config(max_steps=4, packed_seq_len=1024), tmp_path, tiny_loader(model_root))
    assert result.status == "completed" and result.steps == 4 and result.losses[-1] < result.losses[0]
    with pytest.raises(ValueError, match="one whole example"):
        tiny_config(packed_seq_len=256)  # max_seq_len 512 would not fit a row
