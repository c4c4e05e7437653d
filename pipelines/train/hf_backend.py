"""The `hf` training backend: a plain transformers + PEFT LoRA loop (CPU default, single-GPU fallback).

Same hyperparameters and the same adapter format (HF-PEFT `adapter_config.json` +
`adapter_model.safetensors`) as the NeMo AutoModel backend. The loop checkpoints every N steps
(adapter, optimizer, scheduler, RNG state, step) and resumes from the last checkpoint, so a killed
task that retries ends with the same adapter as an uninterrupted run. A diverging run (non-finite
loss, or loss far above its start) stops early and says so.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipelines.hardware import bf16_usable


class TrainConfig(BaseModel):
    """One variant's hyperparameters (a sweep is a list of these)."""

    model_config = ConfigDict(extra="forbid")

    base_model: str = "smollm2-135m-instruct"
    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="compute dtype on CPU (train.precision sets it for every variant)"
    )
    learning_rate: float = Field(default=2e-4, gt=0, le=1)
    optimizer: Literal["adam", "adamw"] = "adamw"
    weight_decay: float = Field(default=0.0, ge=0)
    warmup_steps: int = Field(default=5, ge=0)
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="cosine annealing floor, as a share of the LR")
    lora_rank: int = Field(default=16, ge=1, le=512)
    lora_alpha: int = Field(default=32, ge=1)
    lora_dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    lora_layers: int | None = Field(
        default=None,
        ge=1,
        description="adapt only the top N transformer layers (backward "
        "then stops there: faster steps on CPU); None = every layer",
    )
    epochs: float | None = Field(
        default=None,
        gt=0,
        description="train for this many passes over the training rows "
        "(the step count follows the training set's size, bounded by max_steps_cap)",
    )
    max_steps: int | None = Field(
        default=None,
        ge=1,
        description="a fixed step count, whatever the training set's size "
        "(used when epochs is not set; neither: one epoch)",
    )
    max_steps_cap: int | None = Field(default=None, ge=1, description="upper bound on the resolved step count")
    batch_size: int = Field(default=8, ge=1)
    max_seq_len: int = Field(default=768, ge=16)
    packed_seq_len: int | None = Field(
        default=None,
        ge=16,
        description="pack each step's examples into rows of up to this "
        "many tokens (first-fit decreasing; each example attends only to itself, its "
        "positions restart at 0): no padding, the same examples per step and the same "
        "loss as unpacked; None = one padded row per example",
    )
    checkpoint_every: int = Field(default=20, ge=1)
    seed: int = 0
    divergence_factor: float = Field(default=4.0, gt=1)

    @model_validator(mode="after")
    def _one_schedule(self) -> TrainConfig:
        if self.epochs is not None and self.max_steps is not None:
            raise ValueError("set epochs (bounded by max_steps_cap) or max_steps, not both")
        if self.packed_seq_len is not None and self.packed_seq_len < self.max_seq_len:
            raise ValueError(
                f"packed_seq_len ({self.packed_seq_len}) must hold one whole example of max_seq_len "
                f"({self.max_seq_len}) tokens"
            )
        return self


def schedule_steps(examples: int, batch_size: int, epochs: float | None, max_steps: int | None, cap: int | None) -> int:
    """Optimizer steps of a run. With `epochs`: enough batches of `batch_size` to pass `epochs` times over
    `examples` rows, ceil(examples * epochs / batch_size); without: `max_steps`, or one epoch when that is
    not set either. `cap`, when set, bounds the result; at least one step."""
    if batch_size < 1:
        raise ValueError(f"schedule: batch_size must be >= 1, got {batch_size}")
    if max_steps is not None and epochs is None:
        steps = max_steps
    elif examples < 1:
        raise ValueError("schedule: an epoch-based schedule needs at least one training example")
    else:
        steps = math.ceil(examples * (1.0 if epochs is None else epochs) / batch_size)
    return max(1, min(steps, cap) if cap is not None else steps)


def steps_for(cfg: TrainConfig, examples: int) -> int:
    """`schedule_steps` for one variant's settings on `examples` training rows."""
    return schedule_steps(examples, cfg.batch_size, cfg.epochs, cfg.max_steps, cfg.max_steps_cap)


def epochs_seen(steps: int, batch_size: int, examples: int) -> float:
    """Passes over the training rows that `steps` batches of `batch_size` make."""
    return steps * batch_size / max(1, examples)


@dataclass
class TrainResult:
    adapter_dir: str
    status: Literal["completed", "diverged"]
    steps: int
    resumed_from: int
    tokens: int
    seconds: float
    tokens_per_s: float
    final_loss: float
    losses: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def top_layers(num_layers: int, top: int | None) -> list[int] | None:
    """Indices of the top `top` layers (None: all layers)."""
    return None if top is None or top >= num_layers else list(range(num_layers - top, num_layers))


def cosine_lr(step: int, total: int, cfg: TrainConfig) -> float:
    """Linear warmup to the LR, then cosine annealing down to min_lr_ratio x LR at the last step."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return cfg.learning_rate * (step + 1) / cfg.warmup_steps
    span = max(1, total - cfg.warmup_steps - 1)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio * cfg.learning_rate
    return floor + (cfg.learning_rate - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def encode(tokenizer: Any, turns: list[dict[str, str]], target: str, max_len: int) -> tuple[list[int], list[int]]:
    """Token ids and labels: the loss is on the target call (and end-of-turn) only."""
    prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
    target_ids = tokenizer(target + tokenizer.eos_token, add_special_tokens=False).input_ids
    prompt_ids = prompt_ids[-max(1, max_len - len(target_ids)) :]  # keep the end of long prompts
    ids = (prompt_ids + target_ids)[:max_len]
    labels = ([-100] * len(prompt_ids) + target_ids)[:max_len]
    return ids, labels


def train_lora(
    examples: list[tuple[list[dict[str, str]], str]],
    cfg: TrainConfig,
    out_dir: Path,
    load_base: Callable[[str], tuple[Any, Any]],
    on_step: Callable[[int, float, float], None] | None = None,
) -> TrainResult:
    """Train one LoRA variant on (chat turns, target JSON) pairs; resume from `out_dir/checkpoint`."""
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not examples:
        raise ValueError("no training examples")
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_base(cfg.base_model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    on_cpu = next(model.parameters()).device.type == "cpu"
    bf16 = cfg.precision == "bf16" and on_cpu and bf16_usable("train.precision bf16", "training")
    if bf16:  # the frozen base once in bf16 (no per-step cast); PEFT keeps the adapter it adds in fp32
        model = model.to(torch.bfloat16)
    model = _with_lora(model, cfg)
    encoded = [encode(tokenizer, turns, target, cfg.max_seq_len) for turns, target in examples]
    device = next(model.parameters()).device  # CPU here; a GPU when the loader put the model there
    steps_per_epoch = math.ceil(len(encoded) / cfg.batch_size)
    total = steps_for(cfg, len(encoded))
    params, optimizer, scheduler = _optimizer(model, cfg, total)

    ckpt = out_dir / "checkpoint"
    start, losses, lrs, tokens = 0, [], [], 0
    if (found := last_checkpoint(out_dir)) is not None:
        state = json.loads((found / "state.json").read_text())
        set_peft_model_state_dict(model, load_file(str(found / "adapter_model.safetensors")))
        optimizer.load_state_dict(torch.load(found / "optimizer.pt", weights_only=False))
        scheduler.load_state_dict(torch.load(found / "scheduler.pt", weights_only=False))
        torch.set_rng_state(torch.load(found / "rng.pt", weights_only=False))
        start, losses, lrs, tokens = state["step"], state["losses"], state["learning_rates"], state["tokens"]
    resumed_from = start

    model.train()
    started = time.perf_counter()
    status: Literal["completed", "diverged"] = "completed"
    for step in range(start, total):
        batch = {
            k: v.to(device) for k, v in _batch(encoded, step, steps_per_epoch, cfg, tokenizer.pad_token_id).items()
        }
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):  # the loss itself in fp32 (_target_loss)
            loss = _target_loss(model, batch)
        value = float(loss.detach())
        if not math.isfinite(value) or (losses and value > cfg.divergence_factor * max(losses[0], 1e-3)):
            status = "diverged"
            losses.append(value)
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(value)
        tokens += int(batch["attention_mask"].sum())
        if on_step:
            on_step(step, value, lrs[-1])
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < total:
            _save_checkpoint(model, optimizer, scheduler, ckpt, step + 1, losses, lrs, tokens)
    seconds = time.perf_counter() - started
    final = _save_adapter(model, tokenizer, out_dir)
    return TrainResult(
        adapter_dir=str(final),
        status=status,
        steps=len(lrs),
        resumed_from=resumed_from,
        tokens=tokens,
        seconds=round(seconds, 2),
        tokens_per_s=round(tokens / seconds, 1) if seconds > 0 else 0.0,
        final_loss=losses[-1],
        losses=losses,
        learning_rates=lrs,
    )


def _optimizer(model: Any, cfg: TrainConfig, total: int) -> tuple[list[Any], Any, Any]:
    """The trained parameters (the adapter's, fp32), their optimizer and the cosine schedule over `total` steps."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt_cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    optimizer = opt_cls(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: cosine_lr(s, total, cfg) / cfg.learning_rate)
    return params, optimizer, scheduler


def _with_lora(model: Any, cfg: TrainConfig) -> Any:
    """`model` with the variant's LoRA adapters (rank, alpha, dropout, target modules, the top layers if asked)."""
    from peft import LoraConfig, get_peft_model

    layers = top_layers(model.config.num_hidden_layers, cfg.lora_layers)
    return get_peft_model(
        model,
        LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=cfg.target_modules,
            layers_to_transform=layers,
            task_type="CAUSAL_LM",
        ),
    )


def _save_adapter(model: Any, tokenizer: Any, out_dir: Path) -> Path:
    """Save the adapter and its tokenizer to `out_dir/adapter` and remove the checkpoints; the adapter folder."""
    final = out_dir / "adapter"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    for name in CHECKPOINT_DIRS:
        shutil.rmtree(out_dir / name, ignore_errors=True)
    return final


def pack_rows(lengths: list[int], size: int) -> list[list[int]]:
    """First-fit decreasing: the indices of `lengths` grouped into rows whose lengths sum to at most `size`
    (longest first; ties in index order, so the packing is deterministic)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if lengths[i] > size:
            raise ValueError(f"packing: an example of {lengths[i]} tokens does not fit a row of {size}")
        row = next((r for r, free in enumerate(room) if lengths[i] <= free), None)
        if row is None:
            rows.append([i])
            room.append(size - lengths[i])
        else:
            rows[row].append(i)
            room[row] -= lengths[i]
    return rows


def _batch(
    encoded: list[tuple[list[int], list[int]]], step: int, steps_per_epoch: int, cfg: TrainConfig, pad_id: int
) -> dict[str, Any]:
    """The step's batch: one row per example padded to the longest, or (packed_seq_len) the same examples
    packed into as few rows as fit, with position ids that restart per example."""
    epoch, index = divmod(step, steps_per_epoch)
    batches = _epoch_batches(
        len(encoded), [len(ids) for ids, _ in encoded], cfg.batch_size, cfg.seed * 1_000_003 + epoch
    )
    rows = [encoded[i] for i in batches[index]] if index < len(batches) else [encoded[0]]
    if cfg.packed_seq_len is not None:
        return packed_batch(rows, cfg.packed_seq_len, pad_id)
    return padded_batch(rows, pad_id)


def padded_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, Any]:
    """One row per example, padded to the longest; attention_mask marks the real tokens."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (i, target) in enumerate(rows):
        ids[r, : len(i)] = torch.tensor(i)
        labels[r, : len(target)] = torch.tensor(target)
        mask[r, : len(i)] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def packed_batch(rows: list[tuple[list[int], list[int]]], size: int, pad_id: int) -> dict[str, Any]:
    """The examples packed into rows of at most `size` tokens, padded to the longest row. No attention mask
    goes to the model: the position ids, restarting at 0 for every example (and for the padding), make
    transformers build a block-diagonal causal mask, so no example sees another. `attention_mask` here only
    marks the real tokens (for counting); the loss skips the padding through its -100 labels."""
    import torch

    groups = pack_rows([len(ids) for ids, _ in rows], size)
    width = max(sum(len(rows[i][0]) for i in group) for group in groups)
    ids = torch.full((len(groups), width), pad_id, dtype=torch.long)
    labels = torch.full((len(groups), width), -100, dtype=torch.long)
    mask = torch.zeros((len(groups), width), dtype=torch.long)
    positions = torch.zeros((len(groups), width), dtype=torch.long)
    for r, group in enumerate(groups):
        at = 0
        for i in group:
            seq, lab = rows[i]
            ids[r, at : at + len(seq)] = torch.tensor(seq)
            labels[r, at : at + len(lab)] = torch.tensor(lab)
            labels[r, at] = -100  # the first token of an example is never predicted from the one before it
            mask[r, at : at + len(seq)] = 1
            positions[r, at : at + len(seq)] = torch.arange(len(seq))
            at += len(seq)
        positions[r, at:] = torch.arange(width - at)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask, "position_ids": positions}


def _target_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Mean next-token cross-entropy over the target tokens, computing the LM head only where a label is
    (the same value as the model's own loss; the prompt's logits, most of the sequence, are never built)."""
    import torch.nn.functional as F

    base = model.get_base_model()
    if "position_ids" in batch:  # packed: the position ids separate the examples (see packed_batch)
        inputs = {"position_ids": batch["position_ids"]}
    else:
        inputs = {"attention_mask": batch["attention_mask"]}
    hidden = base.get_decoder()(input_ids=batch["input_ids"], use_cache=False, **inputs).last_hidden_state
    labels = batch["labels"][:, 1:]
    keep = labels != -100
    logits = base.get_output_embeddings()(hidden[:, :-1][keep])
    return F.cross_entropy(logits.float(), labels[keep])


@lru_cache(maxsize=4)
def _epoch_batches_cached(n: int, lengths: tuple[int, ...], batch_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    window = batch_size * 8  # sort by length within windows of 8 batches: little padding, still shuffled
    batches = []
    for w in range(0, n, window):
        chunk = sorted(order[w : w + window], key=lambda i: lengths[i])
        batches += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def _epoch_batches(n: int, lengths: list[int], batch_size: int, seed: int) -> list[list[int]]:
    """One epoch's batches of example indices: a seeded shuffle (a resumed run sees the same order)."""
    return _epoch_batches_cached(n, tuple(lengths), batch_size, seed)


CHECKPOINT_FILES = ("adapter_model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json")
CHECKPOINT_DIRS = ("checkpoint", "checkpoint.old", "checkpoint.tmp")  # the last, the one moved aside, the next


def last_checkpoint(out_dir: Path) -> Path | None:
    """The checkpoint a resumed run starts from: `checkpoint`, or `checkpoint.old` when a kill fell between
    `_save_checkpoint`'s two renames (the newer one was moved aside and the next not yet moved in). A folder
    missing one of its files (a kill while it was being removed) is none."""
    for name in CHECKPOINT_DIRS[:2]:
        if all((out_dir / name / f).is_file() for f in CHECKPOINT_FILES):
            return out_dir / name
    return None


def _save_checkpoint(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    ckpt: Path,
    step: int,
    losses: list[float],
    lrs: list[float],
    tokens: int,
) -> None:
    """Write the checkpoint to a temporary folder, then swap it in (a kill never leaves half a checkpoint)."""
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    tmp = ckpt.with_name("checkpoint.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in get_peft_model_state_dict(model).items()}, str(tmp / "adapter_model.safetensors")
    )
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    torch.save(torch.get_rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(
        json.dumps({"step": step, "losses": losses, "learning_rates": lrs, "tokens": tokens})
    )
    old = ckpt.with_name("checkpoint.old")
    if ckpt.exists():  # else `old` is the one a resume started from: kept until the new one is in
        shutil.rmtree(old, ignore_errors=True)
        os.replace(ckpt, old)
    os.replace(tmp, ckpt)
    shutil.rmtree(old, ignore_errors=True)
