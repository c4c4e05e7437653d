"""KTO on top of an SFT adapter (issue 51, item 2), with TRL's `KTOTrainer`: unpaired thumbs.

Each rated answer (`prep.thumbs`) is one row: the SFT prompt exactly (`toolcall.prompt.chat_turns` in the
adapter's prompt style, as DPO renders it), the answer's call text, and whether it is desirable (rated up, or a
person's correction) or undesirable (rated down). The SFT adapter is trained further (the same LoRA), and the
reference is that SFT model frozen, as for DPO. Thumbs are rarely balanced (people rate few answers, and more up
than down, or the reverse after a bad release): the side with fewer rows is weighted up so both sides weigh the
same in the loss (`balanced_weights`), unless the settings fix the weights. A row longer than `max_length` is left
out and counted (TRL would cut its answer).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config.tune import KtoSettings
from pipelines.errors import DataProblem
from pipelines.toolcall.calls import call_text
from pipelines.toolcall.prompt import chat_turns, system_for
from pipelines.tune.dpo import (
    answer_tokens,
    policy_and_reference,
    preference_args,
    prompt_text,
    step_lines,
    train_and_save,
    trained_tokens,
)

if TYPE_CHECKING:
    import pandas as pd

KtoRow = tuple[list[dict[str, str]], str, bool]  # (the SFT prompt's turns, the answer's call text, desirable)


@dataclass
class KtoResult:
    adapter_dir: str
    rows: int
    desirable: int
    undesirable: int
    desirable_weight: float
    undesirable_weight: float
    steps: int
    seconds: float
    tokens: int
    losses: list[float] = field(default_factory=list)
    reward_margins: list[float] = field(default_factory=list)  # each step's desirable minus undesirable reward
    too_long: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def thumb_rows(thumbs: pd.DataFrame, style: Any) -> list[KtoRow]:
    """Each rated answer as (the SFT prompt's turns, the answer's call text, desirable)."""
    return [
        (chat_turns(system_for(row, style), row["messages_json"]), call_text(row["completion_json"]),
         bool(row["desirable"]))
        for row in thumbs.to_dict("records")
    ]  # fmt: skip


def too_few(desirable: int, undesirable: int, cfg: KtoSettings, option: str = "--min-rows") -> str | None:
    """The line that says KTO is skipped for want of rated answers (naming the `option` that sets the floor): it
    needs `min_rows` in the training split and at least one undesirable answer (the signal KTO adds to SFT)."""
    if desirable + undesirable >= cfg.min_rows and undesirable > 0:
        return None
    return (
        f"kto: skipped: {desirable} desirable and {undesirable} undesirable training answer(s), it needs at least "
        f"{cfg.min_rows} in all ({option}) and one undesirable"
    )


def balanced_weights(desirable: int, undesirable: int, cfg: KtoSettings) -> tuple[float, float]:
    """KTO's (desirable, undesirable) loss weights: those the settings fix, else the rarer side weighted up so that
    weight x count is equal on both sides (TRL's advice: their ratio within [1, 4/3])."""
    if cfg.desirable_weight is not None and cfg.undesirable_weight is not None:
        return cfg.desirable_weight, cfg.undesirable_weight
    if desirable == 0 or undesirable == 0:
        return 1.0, 1.0
    if desirable >= undesirable:
        return 1.0, round(desirable / undesirable, 4)
    return round(undesirable / desirable, 4), 1.0


def fitting(rows: list[KtoRow], tokenizer: Any, cfg: KtoSettings) -> tuple[list[dict[str, Any]], int]:
    """The rows as TRL's prompt / completion / label, those that fit `max_length`, and how many did not."""
    out, too_long = [], 0
    for turns, answer, desirable in rows:
        prompt = prompt_text(tokenizer, turns)
        if len(tokenizer(prompt).input_ids) + answer_tokens(tokenizer, answer) > cfg.max_length:
            too_long += 1
            continue
        out.append({"prompt": prompt, "completion": answer, "label": desirable})  # TRL ends it with end-of-turn
    return out, too_long


def train_kto(
    rows: list[KtoRow],
    cfg: KtoSettings,
    sft_adapter: Path,
    out_dir: Path,
    load_base: Callable[[], tuple[Any, Any]],
    progress: Callable[[str], None] | None = None,
    *,
    bf16: bool = False,
) -> KtoResult:
    """KTO from the SFT adapter in `sft_adapter` -> `out_dir/adapter` (same LoRA, trained further); `progress`
    gets a line per logged step; `bf16`: compute in bf16 (`dpo.quiet_args`, `dpo.frozen_in`)."""
    import torch
    from datasets import Dataset
    from trl import KTOConfig, KTOTrainer

    line = step_lines("kto", progress)
    started = time.perf_counter()
    torch.manual_seed(cfg.seed)
    base, tokenizer = load_base()
    texts, too_long = fitting(rows, tokenizer, cfg)
    desirable = sum(1 for t in texts if t["label"])
    undesirable = len(texts) - desirable
    if not texts or too_few(desirable, undesirable, cfg):  # the floor holds for the rows that train
        raise DataProblem(
            f"kto: {desirable} desirable and {undesirable} undesirable answer(s) fit max_length {cfg.max_length} "
            f"({too_long} longer): it needs {cfg.min_rows} in all and an undesirable one"
        )
    weights = balanced_weights(desirable, undesirable, cfg)
    policy, reference = policy_and_reference(base, load_base, sft_adapter, bf16)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = KTOConfig(
        **preference_args(cfg, out_dir, len(texts), bf16), desirable_weight=weights[0], undesirable_weight=weights[1]
    )
    # KTO reads its rows in order (each row's KL completion is its neighbour's in a fixed-order batch): shuffled,
    # seeded, so a batch mixes desirable and undesirable answers rather than taking each source in turn
    data = Dataset.from_list(texts).shuffle(seed=cfg.seed)
    trainer = KTOTrainer(model=policy, ref_model=reference, args=args, train_dataset=data, processing_class=tokenizer)
    logged, final = train_and_save(trainer, policy, tokenizer, out_dir, line)
    return KtoResult(
        adapter_dir=str(final),
        rows=len(texts),
        desirable=desirable,
        undesirable=undesirable,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
        too_long=too_long,
        steps=int(trainer.state.global_step),
        seconds=round(time.perf_counter() - started, 2),
        tokens=trained_tokens(logged),
        losses=[float(e["loss"]) for e in logged],
        reward_margins=[float(e["rewards/margins"]) for e in logged if "rewards/margins" in e],
    )
