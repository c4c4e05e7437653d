"""The `nemo` training backend: NVIDIA NeMo AutoModel's fine-tuning recipe, launched from a generated
recipe YAML in its own environment (`make nemo-env` here; the NeMo container on a cluster).

Same hyperparameters as the `hf` backend (TrainConfig), same output: an HF-PEFT adapter in
`out/adapter`. On GPU nodes: `torchrun --nproc-per-node N -m nemo_automodel.recipes.llm.train_ft`
(NCCL, tensor parallelism as configured). Without a GPU: the same recipe through
`pipelines.train.nemo_cpu` (a documented CPU adaptation). The recipe checkpoints every N steps into
`out/nemo-checkpoints` and resumes from there when a retried task starts it again.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from rich.console import Console

from pipelines.config import REPO_ROOT, Settings
from pipelines.errors import NotRetryable
from pipelines.services import free_port, stop_group
from pipelines.train.hf_backend import TrainConfig, TrainResult, encode, pack_rows, steps_for, top_layers

RECIPE_MODULE = "nemo_automodel.recipes.llm.train_ft"
STEP_LINE = re.compile(
    r"\bstep (\d+) \| epoch \d+ \| loss ([-+0-9.eEnaif]+) \|.*?\blr ([0-9.eE+-]+) \|.*?\btps ([0-9.]+)"
)


class NemoUnavailable(NotRetryable):
    """The NeMo AutoModel environment is missing (run `make nemo-env`) or its recipe failed."""


class VariantTimedOut(TimeoutError):
    """A variant's training ran past its limit and was stopped; retryable: it resumes from its checkpoint."""


def total_steps(cfg: TrainConfig, examples: int) -> int:
    """The recipe's max_steps: the same schedule as the hf backend (pipelines.train.hf_backend.schedule_steps)."""
    return steps_for(cfg, examples)


def epochs_to_cover(steps: int, batch_size: int, examples: int) -> int:
    """The recipe's num_epochs: enough passes for `steps` even when an epoch drops its last partial batch
    (max_steps ends the run first)."""
    return max(1, math.ceil(steps / max(1, examples // batch_size)))


def target_patterns(cfg: TrainConfig, num_layers: int) -> list[str]:
    """NeMo's LoRA targets (wildcards over module names), restricted to the top layers when asked."""
    layers = top_layers(num_layers, cfg.lora_layers)
    if layers is None:
        return [f"*.{m}" for m in cfg.target_modules]
    return [f"*.layers.{i}.*.{m}" for i in layers for m in cfg.target_modules]


def packs_per_step(cfg: TrainConfig, lengths: list[int]) -> tuple[int, int]:
    """(packs in the training set, packs per optimizer step) for `packed_seq_len`: AutoModel's batch counts
    packed rows, ours counts examples, so a step takes as many packs as hold `batch_size` examples on
    average (first-fit decreasing over the real token lengths; NeMo's greedy knapsack makes as many packs or
    a few more, so the recipe's epochs still cover its steps). Whole packs: a step holds ~batch_size examples."""
    packs = len(pack_rows(lengths, cfg.packed_seq_len or cfg.max_seq_len))
    return packs, max(1, round(cfg.batch_size * packs / max(1, len(lengths))))


def recipe(
    cfg: TrainConfig,
    *,
    base_model_path: str,
    num_layers: int,
    train_file: str,
    checkpoint_dir: str,
    examples: int,
    gpus: int = 0,
    tensor_parallel_size: int = 1,
    lengths: list[int] | None = None,
) -> dict[str, Any]:
    """The AutoModel fine-tuning recipe (`_target_` YAML) for one sweep variant. With `packed_seq_len`,
    `lengths` (each example's tokens) size the packed batch so that a step sees ~batch_size examples and
    the step count stays the unpacked one."""
    steps = total_steps(cfg, examples)
    on_gpu = gpus > 0
    batch, rows = cfg.batch_size, examples
    if cfg.packed_seq_len is not None:
        if not lengths or len(lengths) != examples:
            raise ValueError("recipe: packing needs every training example's token length")
        rows, batch = packs_per_step(cfg, lengths)
    dp = max(1, gpus // tensor_parallel_size) if on_gpu else 1
    batch = math.ceil(batch / dp) * dp  # AutoModel needs the global batch to be a multiple of the data-parallel size
    spec = {
        "recipe": "TrainFinetuneRecipeForNextTokenPrediction",
        "seed": cfg.seed,
        "dist_env": {"backend": "nccl" if on_gpu else "gloo", "timeout_minutes": 30},
        "model": {
            "_target_": "nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained",
            "pretrained_model_name_or_path": base_model_path,
            "torch_dtype": "bfloat16" if on_gpu else "float32",
            "attn_implementation": "sdpa",
        },
        "distributed": _distributed_spec(gpus, tensor_parallel_size),
        "step_scheduler": {
            "global_batch_size": batch,
            "local_batch_size": max(1, batch // dp),
            # packed: one epoch more than our first-fit count needs, in case NEAT's greedy knapsack
            # makes fewer packs (max_steps ends the run first; a short run is an error, see train_nemo)
            "max_steps": steps,
            "num_epochs": epochs_to_cover(steps, batch, rows) + (1 if cfg.packed_seq_len is not None else 0),
            "ckpt_every_steps": cfg.checkpoint_every,
            "val_every_steps": steps + 1,
        },
        **_optimizer_specs(cfg),
        "checkpoint": {
            "enabled": True,
            "checkpoint_dir": checkpoint_dir,
            "model_save_format": "safetensors",
            "save_consolidated": False,
        },
        **_data_specs(cfg, train_file),
        "peft": {
            "_target_": "nemo_automodel.components._peft.lora.PeftConfig",
            "dim": cfg.lora_rank,
            "alpha": cfg.lora_alpha,
            "dropout": cfg.lora_dropout,
            "target_modules": target_patterns(cfg, num_layers),
            "use_triton": on_gpu,
        },
        "loss_fn": {"_target_": "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"},
    }
    if cfg.packed_seq_len is not None:  # AutoModel's bin-packing; "neat" works with any attention implementation
        spec["packed_sequence"] = {
            "packed_sequence_size": cfg.packed_seq_len,
            "packing_strategy": "neat",
            "drop_long_samples": False,
        }
    return spec


def _distributed_spec(gpus: int, tensor_parallel_size: int) -> dict[str, Any]:
    """The recipe's `distributed` section: FSDP2 over the GPUs (tensor parallel as asked), one fp32 rank on CPU."""
    on_gpu = gpus > 0
    return {
        "_target_": "nemo_automodel.components.distributed.fsdp2.FSDP2Manager",
        "dp_size": max(1, gpus // tensor_parallel_size) if on_gpu else 1,
        "tp_size": tensor_parallel_size if on_gpu else 1,
        "pp_size": 1,
        "cp_size": 1,
        # FSDP2Config's default policy computes in bf16: on one rank (no sharding) NeMo casts the
        # whole model to bf16 at setup, the LoRA adapter and so its optimizer state included.
        # bench/nemo_bf16.py profiles that policy against fp32 on CPU. On CPU the model computes
        # in its own fp32, so the adapter trains in fp32; the GPU keeps bf16.
        **(
            {}
            if on_gpu
            else {
                "mp_policy": {
                    "_target_": "torch.distributed.fsdp.MixedPrecisionPolicy",
                    "param_dtype": None,
                    "reduce_dtype": None,
                    "output_dtype": None,
                    "cast_forward_inputs": False,
                }
            }
        ),
    }


def _optimizer_specs(cfg: TrainConfig) -> dict[str, Any]:
    """The recipe's `optimizer`, `lr_scheduler` and `clip_grad_norm` sections."""
    return {
        "optimizer": {
            "_target_": "torch.optim.AdamW" if cfg.optimizer == "adamw" else "torch.optim.Adam",
            "lr": cfg.learning_rate,
            "weight_decay": cfg.weight_decay,
            "betas": [0.9, 0.999],
            "eps": 1e-8,
        },
        "lr_scheduler": {
            "lr_decay_style": "cosine",
            "lr_warmup_steps": cfg.warmup_steps,
            "min_lr": cfg.learning_rate * cfg.min_lr_ratio,
        },
        "clip_grad_norm": {"max_norm": 1.0},
    }


def _data_specs(cfg: TrainConfig, train_file: str) -> dict[str, Any]:
    """The recipe's `dataset` (our chat rows, loss on the final assistant turn) and `dataloader` sections."""
    return {
        "dataset": {
            "_target_": "nemo_automodel.components.datasets.llm.chat_dataset.ChatDataset",
            "path_or_dataset_id": train_file,
            "split": "train",
            "seq_length": cfg.max_seq_len,
            "truncation": "longest_first",
            "mask_history": True,
        },
        "dataloader": {
            "_target_": "torchdata.stateful_dataloader.StatefulDataLoader",
            "collate_fn": "nemo_automodel.components.datasets.utils.default_collater",
            "shuffle": True,
        },
    }


def write_chat_dataset(pairs: list[tuple[list[dict[str, str]], str]], path: Path) -> int:
    """Our (turns, target) pairs as OpenAI-format chat rows; the loss is on the final assistant turn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for turns, target in pairs:
            handle.write(
                json.dumps({"messages": [*turns, {"role": "assistant", "content": target}]}, ensure_ascii=False) + "\n"
            )
    return len(pairs)


def launch_command(settings: Settings, config_path: Path, gpus: int) -> list[str]:
    python = settings.train.nemo_python
    if gpus > 0:
        return [
            str(Path(python).parent / "torchrun"),
            f"--nproc-per-node={gpus}",
            "-m",
            RECIPE_MODULE,
            "--config",
            str(config_path),
        ]
    return [python, "-m", "pipelines.train.nemo_cpu", "--config", str(config_path)]


def _latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    found = [
        (int(m.group(1)), p)
        for p in checkpoint_dir.glob("epoch_*_step_*")
        if (m := re.search(r"step_(\d+)$", p.name)) and (p / "model" / "adapter_model.safetensors").is_file()
    ]
    return max(found)[1] if found else None


def train_nemo(
    settings: Settings,
    cfg: TrainConfig,
    pairs: list[tuple[list[dict[str, str]], str]],
    out: Path,
    on_step: Callable[[int, float, float], None] | None = None,
    *,
    tensor_parallel_size: int = 1,
    gpus: int = 1,
    console: Console | None = None,
) -> TrainResult:
    from transformers import AutoConfig

    from pipelines.base_models import prepare_base

    if not Path(settings.train.nemo_python).is_file():
        raise NemoUnavailable(f"no NeMo AutoModel environment at {settings.train.nemo_python}: run `make nemo-env`")
    import torch

    gpus = gpus if torch.cuda.is_available() else 0
    base = prepare_base(cfg.base_model, settings)
    num_layers = AutoConfig.from_pretrained(base).num_hidden_layers
    out.mkdir(parents=True, exist_ok=True)
    train_file = out / "train.jsonl"
    write_chat_dataset(pairs, train_file)
    checkpoints = out / "nemo-checkpoints"
    resumed = _latest_checkpoint(checkpoints)
    spec = recipe(
        cfg,
        base_model_path=base,
        num_layers=num_layers,
        train_file=str(train_file),
        checkpoint_dir=str(checkpoints),
        examples=len(pairs),
        gpus=gpus,
        tensor_parallel_size=tensor_parallel_size,
        lengths=_token_lengths(cfg, base, pairs),
    )
    config_path = out / "nemo-recipe.yaml"
    config_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = _launch_env(gpus)
    steps = _StepLog()
    log = out / "nemo-train.log"
    started = time.perf_counter()
    limit = settings.train.variant_timeout_s
    code = _run_recipe(launch_command(settings, config_path, gpus), out, env, log, limit, steps, on_step)
    seconds = time.perf_counter() - started
    resumed_from = _check_finished(code, seconds, limit, log, spec["step_scheduler"]["max_steps"], resumed, steps)
    latest = _latest_checkpoint(checkpoints)
    if latest is None:
        raise NemoUnavailable(f"the NeMo AutoModel recipe wrote no adapter under {checkpoints}; see {log}")
    adapter = out / "adapter"
    shutil.rmtree(adapter, ignore_errors=True)
    shutil.copytree(latest / "model", adapter)
    losses = steps.losses
    status: Literal["completed", "diverged"] = (
        "completed" if losses and all(math.isfinite(v) for v in losses) else "diverged"
    )
    rate = statistics.median(steps.tps[1:] or steps.tps) if steps.tps else 0.0
    return TrainResult(
        adapter_dir=str(adapter),
        status=status,
        steps=len(losses),
        resumed_from=resumed_from,
        tokens=int(rate * seconds),
        seconds=round(seconds, 2),
        tokens_per_s=round(rate, 1),
        final_loss=losses[-1] if losses else float("nan"),
        losses=losses,
        learning_rates=steps.lrs,
    )


def _token_lengths(cfg: TrainConfig, base: str, pairs: list[tuple[list[dict[str, str]], str]]) -> list[int] | None:
    """Each training example's token count when the recipe packs (`packed_seq_len`), else None."""
    if cfg.packed_seq_len is None:
        return None
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    return [len(encode(tokenizer, turns, target, cfg.max_seq_len)[0]) for turns, target in pairs]


def _launch_env(gpus: int) -> dict[str, str]:
    """The recipe's environment: our repository importable, offline; on CPU, a one-rank process group."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if gpus == 0:
        env.update(
            {
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
            }
        )
    return env


@dataclass
class _StepLog:
    """What the recipe's step lines (`STEP_LINE`) said: each step's loss, learning rate and tokens/s."""

    losses: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    tps: list[float] = field(default_factory=list)
    last_step: int = -1

    def read(self, line: str, on_step: Callable[[int, float, float], None] | None) -> None:
        """Record the step lines in `line` of the recipe's output, each also passed to `on_step`."""
        for m in STEP_LINE.finditer(line):
            step, loss, lr = int(m.group(1)), float(m.group(2)), float(m.group(3))
            self.losses.append(loss)
            self.last_step = max(self.last_step, step)
            self.lrs.append(lr)
            self.tps.append(float(m.group(4)))
            if on_step:
                on_step(step, loss, lr)


def _run_recipe(
    command: list[str],
    out: Path,
    env: dict[str, str],
    log: Path,
    limit: float,
    steps: _StepLog,
    on_step: Callable[[int, float, float], None] | None,
) -> int:
    """Run the recipe, its output copied to `log` and its step lines read into `steps`, stopped past `limit`
    seconds; its exit code."""
    with log.open("w") as sink:
        proc = subprocess.Popen(  # noqa: S603 (our own executable and arguments)
            command,
            cwd=out,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        # the read loop below blocks on the recipe's output: a timer stops the whole launch (torchrun and
        # its workers) past the limit, which ends the loop
        watchdog = threading.Timer(limit, stop_group, args=(proc,))
        watchdog.daemon = True
        watchdog.start()
        if proc.stdout is None:
            raise NemoUnavailable("the recipe's output pipe did not open")
        try:
            for line in proc.stdout:
                sink.write(line)
                steps.read(line, on_step)
            return proc.wait(timeout=60)
        finally:  # whatever ends the loop (the task's own timeout, an MLflow error, Ctrl-C): no orphan trainer
            watchdog.cancel()
            if proc.poll() is None:
                stop_group(proc)


def _check_finished(
    code: int, seconds: float, limit: float, log: Path, max_steps: int, resumed: Path | None, steps: _StepLog
) -> int:
    """Raise unless the recipe exited 0 having trained all `max_steps` (VariantTimedOut past `limit`, else
    NemoUnavailable); the step it resumed from."""
    if seconds >= limit and code != 0:
        raise VariantTimedOut(
            f"the NeMo AutoModel recipe ran past train.variant_timeout_s ({limit:g} s) and was "
            f"stopped; a retry resumes from its last checkpoint; see {log}"
        )
    if code != 0:
        raise NemoUnavailable(f"the NeMo AutoModel recipe exited with {code}; see {log}")
    step = re.search(r"step_(\d+)$", resumed.name) if resumed else None
    if resumed and step is None:  # `_latest_checkpoint` returns step_<N> folders only
        raise NemoUnavailable(f"not a checkpoint folder: {resumed}")
    resumed_from = int(step.group(1)) + 1 if step else 0
    trained = max(steps.last_step + 1, resumed_from)  # a retry of a finished run resumes at max_steps and logs no step
    if steps.last_step < 0 and trained < max_steps:
        raise NemoUnavailable(
            f"the NeMo AutoModel recipe exited 0 but logged no training step its log format "
            f"(`step N | epoch E | loss ...`) matches; see {log}"
        )
    if trained < max_steps:  # its data loader ran out before max_steps: not the schedule we asked for
        raise NemoUnavailable(
            f"the NeMo AutoModel recipe stopped at step {trained} of {max_steps} "
            f"(its epochs ran out: step_scheduler.num_epochs too small for the batches it made); "
            f"see {log}"
        )
    return resumed_from
