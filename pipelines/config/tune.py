"""The settings of the `tune` stage: preference and reward tuning after the SFT sweep (issue 51)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipelines.config.base import _Section

TuneMethod = Literal["off", "dpo", "kto", "grpo"]
TUNE_METHODS: tuple[TuneMethod, ...] = ("off", "dpo", "kto", "grpo")


class DpoSettings(_Section):
    """DPO's hyperparameters (`tune.dpo`, `flywheel tune dpo` options)."""

    beta: float = Field(default=0.1, gt=0, description="strength of the pull towards the SFT reference (DPO's beta)")
    learning_rate: float = Field(default=5e-5, gt=0, le=1, description="the adapter's learning rate")
    max_steps: int = Field(default=40, ge=1, description="optimizer steps")
    batch_size: int = Field(default=4, ge=1, description="pairs per optimizer step")
    max_length: int = Field(
        default=2048, ge=32, description="prompt and answer tokens; a longer pair is left out and counted"
    )
    min_pairs: int = Field(default=16, ge=1, description="fewer training pairs than this: DPO is skipped, saying so")
    seed: int = Field(default=0, description="the trainer's seed")


class KtoSettings(_Section):
    """KTO's hyperparameters (`tune.kto`, `flywheel tune kto` options): unpaired thumbs (`flywheel labels thumbs`)."""

    beta: float = Field(default=0.1, gt=0, description="strength of the pull towards the SFT reference (KTO's beta)")
    learning_rate: float = Field(default=5e-5, gt=0, le=1, description="the adapter's learning rate")
    max_steps: int = Field(default=40, ge=1, description="optimizer steps")
    batch_size: int = Field(
        default=4, ge=2, description="rated answers per optimizer step (at least 2: KTO's KL term mixes a batch)"
    )
    max_length: int = Field(
        default=2048, ge=32, description="prompt and answer tokens; a longer row is left out and counted"
    )
    min_rows: int = Field(
        default=16, ge=1, description="fewer rated training answers than this (or no undesirable one): skipped"
    )
    desirable_weight: float | None = Field(
        default=None, gt=0, description="loss weight of a desirable answer; None (with undesirable_weight None): "
        "the rarer side weighted up so both weigh the same"
    )  # fmt: skip
    undesirable_weight: float | None = Field(default=None, gt=0, description="loss weight of an undesirable answer")
    seed: int = Field(default=0, description="the trainer's seed")

    @model_validator(mode="after")
    def _both_weights_or_neither(self) -> KtoSettings:
        if (self.desirable_weight is None) != (self.undesirable_weight is None):
            raise ValueError("set both desirable_weight and undesirable_weight, or neither (the rarer side up)")
        return self


class GrpoSettings(_Section):
    """GRPO's hyperparameters (`tune.grpo`, `flywheel tune grpo` options): sampled answers rewarded by the
    evaluation's own scorer (`tune.reward`)."""

    group_size: int = Field(default=4, ge=2, le=64, description="sampled answers per prompt (GRPO's group)")
    kl_beta: float = Field(
        default=0.04, ge=0, description="KL coefficient against the SFT adapter (0: no reference model)"
    )
    learning_rate: float = Field(default=1e-5, gt=0, le=1, description="the adapter's learning rate")
    max_steps: int = Field(default=40, ge=1, description="optimizer steps, one group per prompt each")
    prompts_per_step: int = Field(default=2, ge=1, description="distinct prompts in one optimizer step")
    max_prompts: int = Field(
        default=256, ge=1, description="training prompts drawn (stratified by tool, seeded) from the SFT train split"
    )
    temperature: float = Field(default=1.0, gt=0, le=2, description="sampling temperature of the group's answers")
    max_new_tokens: int | None = Field(
        default=None, ge=4, description="the answer budget while sampling; None: the sweep's (as served)"
    )
    max_prompt_tokens: int = Field(default=1536, ge=32, description="a longer prompt is left out and counted")
    constrained: bool | None = Field(
        default=None,
        description="sample under the tool-call grammar; None: as models are served (triton.constrained)",
    )
    seed: int = Field(default=0, description="the seed of the prompts' draw, the sampling and the trainer")


class TuneSettings(_Section):
    """The `tune` stage after the SFT sweep: which method trains the sweep's best adapter further before it is
    evaluated, registered and gated like any candidate. A project's own choice (`flywheel project tune`) wins
    over `method`."""

    method: TuneMethod = Field(
        default="off",
        description="off (SFT only), dpo (preference pairs: `flywheel labels pairs`), kto (unpaired thumbs: "
        "`flywheel labels thumbs`) or grpo (the scorer's reward on the training prompts). Off until a method's "
        "benefit is measured on real data (the quality page)",
    )
    dpo: DpoSettings = Field(default_factory=DpoSettings)
    kto: KtoSettings = Field(default_factory=KtoSettings)
    grpo: GrpoSettings = Field(default_factory=GrpoSettings)
