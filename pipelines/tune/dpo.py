"""DPO on top of an SFT adapter (issue 51, item 1), with TRL's `DPOTrainer`.

The SFT adapter is trained further (the same LoRA: rank and target modules, so the result loads, serves and
evaluates like any adapter), and the reference is that SFT model frozen: the base with the SFT adapter merged
in, loaded once and never updated. A pair's prompt is the SFT prompt exactly (`toolcall.prompt.chat_turns` in
the adapter's prompt style, rendered by the tokenizer's chat template), and its chosen and rejected sides are
call texts as the model is trained to write them (`toolcall.calls.call_text`), each ended by TRL with the
end-of-turn token. A pair longer than `max_length` is left out and counted (TRL would cut its answers).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config.tune import DpoSettings
from pipelines.errors import DataProblem
from pipelines.toolcall.calls import call_text
from pipelines.toolcall.prompt import chat_turns, system_for

if TYPE_CHECKING:
    import pandas as pd


DpoConfig = DpoSettings  # one definition: the `tune.dpo` settings are the trainer's hyperparameters


@dataclass
class DpoResult:
    adapter_dir: str
    pairs: int
    steps: int
    seconds: float
    tokens: int
    losses: list[float] = field(default_factory=list)
    reward_margins: list[float] = field(default_factory=list)
    too_long: int = 0  # pairs longer than max_length, left out (TRL would cut their answers or drop them)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def preference_rows(pairs: pd.DataFrame, style: Any) -> list[tuple[list[dict[str, str]], str, str]]:
    """Each pair as (the SFT prompt's turns, the chosen call text, the rejected call text)."""
    return [
        (chat_turns(system_for(row, style), row["messages_json"]), call_text(row["chosen_json"]),
         call_text(row["rejected_json"]))
        for row in pairs.to_dict("records")
    ]  # fmt: skip


def too_few(pairs: int, cfg: DpoConfig, option: str = "--min-pairs") -> str | None:
    """The line that says DPO is skipped for want of pairs (naming the `option` that sets the floor), or None."""
    if pairs >= cfg.min_pairs:
        return None
    return f"dpo: skipped: {pairs} training pair(s), it needs at least {cfg.min_pairs} ({option})"


def prompt_text(tokenizer: Any, turns: list[dict[str, str]]) -> str:
    """The SFT prompt's text for a TRL trainer that tokenizes it with special tokens: a beginning-of-text token
    the chat template already wrote is left to the tokenizer to add once, as SFT has it once."""
    bos = tokenizer.bos_token or ""
    prompt = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    if bos and prompt.startswith(bos) and tokenizer("x").input_ids[:1] == [tokenizer.bos_token_id]:
        prompt = prompt[len(bos) :]
    return prompt


def answer_tokens(tokenizer: Any, answer: str) -> int:
    """The tokens of an answer as TRL trains it: ended with the end-of-turn (eos) token."""
    return len(tokenizer(answer + (tokenizer.eos_token or ""), add_special_tokens=False).input_ids)


def fitting(
    rows: list[tuple[list[dict[str, str]], str, str]], tokenizer: Any, cfg: DpoConfig
) -> tuple[list[dict[str, str]], int]:
    """The pairs as TRL's prompt / chosen / rejected texts, those whose prompt and longer side fit `max_length`
    (TRL would cut a longer one's answers or drop it), and how many did not fit (`prompt_text`)."""
    out, too_long = [], 0
    for turns, chosen, rejected in rows:
        prompt = prompt_text(tokenizer, turns)
        size = len(tokenizer(prompt).input_ids) + max(answer_tokens(tokenizer, side) for side in (chosen, rejected))
        if size > cfg.max_length:
            too_long += 1
            continue
        out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})  # TRL ends each with end-of-turn
    return out, too_long


def quiet_args(seed: int, bf16: bool) -> dict[str, Any]:
    """The trainer arguments DPO, KTO and GRPO share: seeded, on the GPU when there is one, every step logged to
    the progress callback and nothing else (no reporting, no checkpoints, no progress bar, no loader workers);
    bf16 autocast as `bf16` says (TRL would turn it on even on a CPU without bf16 units, where it is emulated many
    times slower than fp32), and activations recomputed in the backward pass only on a GPU (TRL's default: it
    saves memory a CPU run does not need, at the price of a second forward pass)."""
    import torch

    gpu = torch.cuda.is_available()
    return {
        "seed": seed, "use_cpu": not gpu, "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "disable_tqdm": True, "dataloader_num_workers": 0, "bf16": bf16, "gradient_checkpointing": gpu,
    }  # fmt: skip


def preference_args(cfg: Any, out_dir: Path, rows: int, bf16: bool) -> dict[str, Any]:
    """The arguments DPO's and KTO's TRL configs share: `cfg`'s hyperparameters (`tune.dpo` or `tune.kto`), the
    run's folder, the reference pass computed once when the `rows` are reused, and `quiet_args`."""
    return {
        "output_dir": str(out_dir / "trl"), "beta": cfg.beta, "learning_rate": cfg.learning_rate,
        "max_steps": cfg.max_steps, "per_device_train_batch_size": cfg.batch_size, "max_length": cfg.max_length,
        "precompute_ref_log_probs": reused(cfg, rows), **quiet_args(cfg.seed, bf16),
    }  # fmt: skip


def reused(cfg: Any, rows: int) -> bool:
    """Whether the run sees its rows more than once (`max_steps` x `batch_size` > rows): then the frozen
    reference's log-probabilities are computed once before training (TRL's `precompute_ref_log_probs`: the same
    numbers, one reference pass per row instead of one per step)."""
    return int(cfg.max_steps) * int(cfg.batch_size) > rows


def frozen_in(base: Any, bf16: bool) -> Any:
    """The base model for a tune run: on the CPU with `bf16`, cast to bf16 once (the frozen weights; no cast per
    step under autocast, as the hf backend trains SFT); PEFT keeps the adapter it loads on top in fp32."""
    import torch

    if bf16 and next(base.parameters()).device.type == "cpu":
        return base.to(torch.bfloat16)
    return base


def policy_and_reference(
    base: Any, load_base: Callable[[], tuple[Any, Any]], sft_adapter: Path, bf16: bool
) -> tuple[Any, Any]:
    """The SFT adapter on `base`, trainable (the policy), and the SFT model frozen (the reference: a second base
    with the adapter merged in, never updated); both bases in bf16 with `bf16` (`frozen_in`)."""
    from peft import PeftModel

    policy = PeftModel.from_pretrained(frozen_in(base, bf16), str(sft_adapter), is_trainable=True)
    reference_base, _ = load_base()
    merged = PeftModel.from_pretrained(reference_base, str(sft_adapter)).merge_and_unload()
    reference = frozen_in(merged, bf16).eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return policy, reference


def step_lines(method: str, progress: Callable[[str], None] | None) -> Callable[[Any, dict[str, Any]], None]:
    """`train_and_save`'s callback for a preference method: a progress line per logged step with its loss and,
    where TRL logs it, the reward margin."""

    def line(state: Any, logs: dict[str, Any]) -> None:
        if progress is not None:
            margin = logs.get("rewards/margins")
            progress(f"{method}: step {state.global_step}/{state.max_steps} loss {float(logs['loss']):.4f}"
                     + (f" reward margin {float(margin):.4f}" if margin is not None else ""))  # fmt: skip

    return line


def train_and_save(
    trainer: Any, policy: Any, tokenizer: Any, out_dir: Path, line: Callable[[Any, dict[str, Any]], None] | None
) -> tuple[list[dict[str, Any]], Path]:
    """Train with `line(state, logs)` called for each logged step (it sends a progress line, never to stdout: a
    command's JSON result is all it prints there), then save the trained adapter in `out_dir/adapter`; the
    logged steps and that folder."""
    from transformers import PrinterCallback, TrainerCallback

    from pipelines import hardware

    class _Lines(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **_: Any) -> None:
            if line is not None and logs and "loss" in logs:
                line(state, logs)

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            hardware.release_freed_memory()  # each step's freed buffers back to the system: no growth to an OOM

    trainer.remove_callback(PrinterCallback)  # it prints every log to stdout
    trainer.add_callback(_Lines())
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    final = out_dir / "adapter"
    policy.save_pretrained(str(final), selected_adapters=["default"])  # not a frozen "ref" copy TRL may keep
    tokenizer.save_pretrained(final)
    return logged, final


def trained_tokens(logged: list[dict[str, Any]]) -> int:
    """The tokens a TRL run trained on (its last logged `num_tokens`)."""
    return int(float(next((e["num_tokens"] for e in reversed(logged) if "num_tokens" in e), 0)))


def train_dpo(
    rows: list[tuple[list[dict[str, str]], str, str]],
    cfg: DpoConfig,
    sft_adapter: Path,
    out_dir: Path,
    load_base: Callable[[], tuple[Any, Any]],
    progress: Callable[[str], None] | None = None,
    *,
    bf16: bool = False,
) -> DpoResult:
    """DPO from the SFT adapter in `sft_adapter` -> `out_dir/adapter` (same LoRA, trained further); `progress`
    gets a line per logged step; `bf16`: compute in bf16 (`quiet_args`, `frozen_in`)."""
    import torch
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    line = step_lines("dpo", progress)
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    base, tokenizer = load_base()
    texts, too_long = fitting(rows, tokenizer, cfg)
    if not texts or too_few(len(texts), cfg):  # the floor holds for the pairs that train, not those collected
        raise DataProblem(
            f"dpo: {len(texts)} preference pair(s) fit max_length {cfg.max_length} ({too_long} longer), it needs at "
            f"least {max(cfg.min_pairs, 1)}"
        )
    policy, reference = policy_and_reference(base, load_base, sft_adapter, bf16)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = DPOConfig(**preference_args(cfg, out_dir, len(texts), bf16))
    data = Dataset.from_list(texts)
    trainer = DPOTrainer(model=policy, ref_model=reference, args=args, train_dataset=data, processing_class=tokenizer)
    logged, final = train_and_save(trainer, policy, tokenizer, out_dir, line)
    return DpoResult(
        adapter_dir=str(final),
        pairs=len(texts),
        too_long=too_long,
        steps=int(trainer.state.global_step),
        seconds=round(time.perf_counter() - started, 2),
        tokens=trained_tokens(logged),
        losses=[float(e["loss"]) for e in logged],
        reward_margins=[float(e["rewards/margins"]) for e in logged if "rewards/margins" in e],
    )
