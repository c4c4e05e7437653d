"""GRPO on top of an SFT adapter (issue 51, item 3), with TRL's `GRPOTrainer` and the scorer's reward.

The prompts are SFT's own training examples (`toolcall.examples`, in the adapter's prompt style), drawn
stratified by tool and seeded; for each, `group_size` answers are sampled at `temperature` under the grammar the
model is served with (`toolcall.grammar.ToolCallConstraint`, write ids grounded in the prompt's own
conversation), each rewarded by `tune.reward` against the example's call, and the policy moves towards the
answers that beat their group's mean. The SFT adapter is trained further (the same LoRA), and the KL term pulls
towards that SFT adapter as it was (TRL keeps a frozen copy, the "ref" adapter, left out of the saved folder).
A prompt longer than `max_prompt_tokens` is left out and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelines.config.tune import GrpoSettings
from pipelines.errors import DataProblem
from pipelines.toolcall.examples import Example
from pipelines.tune.dpo import frozen_in, quiet_args, train_and_save, trained_tokens
from pipelines.tune.reward import from_score, scored


@dataclass
class GrpoResult:
    adapter_dir: str
    prompts: int
    steps: int
    seconds: float
    tokens: int  # prompt and sampled answer tokens the policy trained on
    losses: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # the mean reward of each step's sampled answers
    wrong_writes: list[float] = field(default_factory=list)  # each step's share of sampled answers that wrong-write
    valid: list[float] = field(default_factory=list)  # each step's share of sampled answers that parse as a call
    too_long: int = 0  # prompts longer than max_prompt_tokens, left out
    constrained: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_rows(
    examples: list[Example], tools: list[str], tokenizer: Any, cfg: GrpoSettings
) -> tuple[list[dict[str, Any]], int]:
    """Each example as a GRPO row (its turns as the prompt, its record id, expected call and grammar tools),
    those whose prompt fits `max_prompt_tokens`, and how many did not fit. The prompt's tokens are the chat
    template's, as served (`toolcall.decode`) and as TRL tokenizes a conversational prompt."""
    rows, too_long = [], 0
    for example, offered in zip(examples, tools, strict=True):
        if len(prompt_ids(tokenizer, example.turns)) > cfg.max_prompt_tokens:
            too_long += 1
            continue
        rows.append(
            {"prompt": example.turns, "record_id": example.record_id, "expected": example.target, "tools": offered}
        )
    return rows, too_long


def prompt_ids(tokenizer: Any, turns: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(ids["input_ids"])


def answer_text(completion: Any) -> str:
    """TRL hands a conversational prompt's completion as [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return "".join(str(m.get("content") or "") for m in completion)
    return str(completion)


def reward_function(effects: Mapping[str, str] | None) -> Callable[..., list[float | None]]:
    """TRL's reward function: `tune.reward` of each sampled answer against its prompt's expected call. It logs
    the step's share of wrong writes and exact calls beside TRL's reward metrics."""

    def toolcall_reward(
        prompts: list[Any], completions: list[Any], record_id: list[str], expected: list[str], **kw: Any
    ) -> list[float | None]:
        texts = [answer_text(c) for c in completions]
        out: list[float | None] = []
        wrong = exact = valid = 0
        for text, gold, rid in zip(texts, expected, record_id, strict=True):
            s = scored(text, gold, effects, rid)  # a failure raises RewardError naming the prompt: never a zero
            wrong += s.wrong_write is not None
            exact += s.exact_match
            valid += s.json_valid
            out.append(from_score(s))
        log = kw.get("log_metric")
        if callable(log) and texts:
            log("toolcall/wrong_write_rate", wrong / len(texts))
            log("toolcall/exact_rate", exact / len(texts))
            log("toolcall/valid_rate", valid / len(texts))
        return out

    return toolcall_reward


def constrain(policy: Any, tokenizer: Any, rows: list[dict[str, Any]]) -> None:
    """Make `policy.generate` decode every sampled answer under its prompt's grammar: each batch row (its prompt's
    unpadded token ids) is matched to its training row's tools; a row that matches none raises (never decoded
    freely)."""
    from transformers import LogitsProcessorList

    from pipelines.toolcall.grammar import ToolCallConstraint

    by_ids = {tuple(prompt_ids(tokenizer, row["prompt"])): row["tools"] for row in rows}
    inner = policy.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        tools = []
        for row_ids, row_mask in zip(ids.tolist(), mask.tolist(), strict=True):
            key = tuple(t for t, m in zip(row_ids, row_mask, strict=True) if m)
            if key not in by_ids:  # a chat template that renders the date renders anew after midnight
                by_ids.update({tuple(prompt_ids(tokenizer, row["prompt"])): row["tools"] for row in rows})
            if key not in by_ids:
                raise DataProblem("grpo: a sampled prompt matches no training prompt: its grammar is unknown")
            tools.append(by_ids[key])
        processors = LogitsProcessorList([ToolCallConstraint(tokenizer, tools)])
        return inner(*args, logits_processor=processors, **kwargs)

    policy.generate = generate


def trl_config(cfg: GrpoSettings, out_dir: Path, max_new_tokens: int, bf16: bool = False) -> Any:
    """TRL's GRPOConfig for `cfg`: one generation batch per step (`prompts_per_step` groups of `group_size`),
    sampled from the whole distribution at `temperature` within the answer budget, logged every step."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir / "trl"),
        beta=cfg.kl_beta,
        learning_rate=cfg.learning_rate,
        max_steps=cfg.max_steps,
        num_generations=cfg.group_size,
        per_device_train_batch_size=cfg.group_size * cfg.prompts_per_step,
        gradient_accumulation_steps=1,
        max_completion_length=max_new_tokens,
        temperature=cfg.temperature,
        top_p=1.0,
        top_k=0,
        generation_kwargs={"min_p": None, "typical_p": 1.0, "repetition_penalty": 1.0},  # the whole distribution
        **quiet_args(cfg.seed, bf16),
    )


def train_grpo(
    examples: list[Example],
    tools: list[str],
    cfg: GrpoSettings,
    sft_adapter: Path,
    out_dir: Path,
    load_base: Callable[[], tuple[Any, Any]],
    *,
    max_new_tokens: int,
    constrained: bool,
    effects: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    bf16: bool = False,
) -> GrpoResult:
    """GRPO from the SFT adapter in `sft_adapter` -> `out_dir/adapter` (same LoRA, trained further) on the
    examples whose prompt fits (`prompt_rows`; `tools`: each example's grammar tools); `progress` gets a line per
    step (never stdout: a command's JSON result is all it prints)."""
    import torch
    from datasets import Dataset
    from peft import PeftModel
    from trl import GRPOTrainer

    def line(state: Any, logs: dict[str, Any]) -> None:
        if progress is not None:
            progress(f"grpo: step {state.global_step}/{state.max_steps} loss {float(logs['loss']):.4f} "
                     f"reward {float(logs.get('reward', float('nan'))):.3f}")  # fmt: skip

    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    base, tokenizer = load_base()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows, too_long = prompt_rows(examples, tools, tokenizer, cfg)
    if not rows:
        raise DataProblem(
            f"grpo: no training prompt fits max_prompt_tokens {cfg.max_prompt_tokens} ({too_long} longer)"
        )
    policy = PeftModel.from_pretrained(frozen_in(base, bf16), str(sft_adapter), is_trainable=True)
    if constrained:
        constrain(policy, tokenizer, rows)
    args = trl_config(cfg, out_dir, max_new_tokens, bf16)
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=reward_function(effects),
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    logged, final = train_and_save(trainer, policy, tokenizer, out_dir, line)  # not TRL's frozen "ref" copy
    return GrpoResult(
        adapter_dir=str(final),
        prompts=len(rows),
        steps=int(trainer.state.global_step),
        seconds=round(time.perf_counter() - started, 2),
        tokens=trained_tokens(logged),
        losses=[float(e["loss"]) for e in logged],
        rewards=[float(e["reward"]) for e in logged if "reward" in e],
        wrong_writes=[float(e["toolcall/wrong_write_rate"]) for e in logged if "toolcall/wrong_write_rate" in e],
        valid=[float(e["toolcall/valid_rate"]) for e in logged if "toolcall/valid_rate" in e],
        too_long=too_long,
        constrained=constrained,
    )
