"""A sweep file: the LoRA sweep's settings (`SweepConfig`), read and checked from YAML, and its variants
(a grid or a seeded random sample of it, each a TrainConfig and a prompt style)."""

from __future__ import annotations

import hashlib
import itertools
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipelines.config import ConfigError
from pipelines.train.hf_backend import TrainConfig

if TYPE_CHECKING:
    from pipelines.toolcall.prompt import PromptStyle

PROMPT_STYLES = ("names", "short", "full")


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    backend: Literal["hf", "nemo"] = "hf"
    method: Literal["grid", "random"] = "grid"
    samples: int | None = Field(default=None, ge=1, description="random search: how many variants")
    seed: int = 0
    base: TrainConfig = Field(default_factory=TrainConfig)
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="TrainConfig field -> values; also "
        "`prompt_style` (names, short, full): the data decides the prompt",
    )
    prompt_style: Literal["short", "names", "full"] = Field(
        default="short", description="the prompt every variant trains with, unless the grid varies `prompt_style`"
    )
    train_examples: int | None = Field(default=None, ge=1, description="seeded sample of the train split; None = all")
    train_sampling: Literal["random", "balanced", "sqrt"] = Field(
        default="sqrt",
        description="how `train_examples` are drawn over (tool, source) strata: `sqrt` gives each a share "
        "that grows with the square root of its size (a large source keeps more than an equal share, a rare tool "
        "far more than its random share), `balanced` equal shares, `random` the window's mix; a stratum with "
        "fewer rows than its share gives all it has",
    )
    val_examples: int = Field(
        default=16,
        ge=1,
        description="validation requests, stratified by tool and source (every "
        "stratum at least once while the count allows): the variant is selected on them",
    )
    select_metric: Literal["exact_match", "arg_f1", "name_accuracy"] = "exact_match"
    tensor_parallel_size: int = Field(default=1, ge=1, description="NeMo on GPUs: tensor-parallel size per variant")
    gpus_per_variant: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _check_grid(self) -> SweepConfig:
        unknown = sorted(set(self.grid) - set(TrainConfig.model_fields) - {"prompt_style"})
        if unknown:
            raise ValueError(
                f"grid: unknown hyperparameter(s) {unknown}; choose from {sorted(TrainConfig.model_fields)}"
            )
        empty = [k for k, v in self.grid.items() if not v]
        if empty:
            raise ValueError(f"grid: no values for {empty}")
        bad_styles = sorted(set(map(str, self.grid.get("prompt_style", []))) - set(PROMPT_STYLES))
        if bad_styles:
            raise ValueError(f"grid: prompt_style {bad_styles}; choose from {list(PROMPT_STYLES)}")
        if self.method == "random" and not self.samples:
            raise ValueError("samples: random search needs the number of variants")
        return self

    def digest(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:10]


def load_sweep(path: str, backend: str | None = None) -> SweepConfig:
    """A sweep file (YAML); a clear error names the bad field."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"sweep: no such file: {path}")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a sweep is a mapping of fields, got {type(data).__name__}")
    if backend:
        data["backend"] = backend
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "sweep"
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None


def variant_points(sweep: SweepConfig) -> list[tuple[TrainConfig, PromptStyle]]:
    """Every grid point (or a seeded random sample of them): its TrainConfig and its prompt style."""
    keys = sorted(sweep.grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*(sweep.grid[k] for k in keys))] or [{}]
    if sweep.method == "random":
        points = random.Random(sweep.seed).sample(points, min(sweep.samples or 1, len(points)))
    base = sweep.base.model_dump()
    out = []
    for point in points:
        # one of PROMPT_STYLES: the grid's are checked when the sweep is read
        style = cast("PromptStyle", str(point.pop("prompt_style", sweep.prompt_style)))
        try:
            out.append((TrainConfig.model_validate({**base, **point}), style))
        except ValidationError as exc:
            raise ConfigError(f"sweep {sweep.name}: variant {point}: {exc.errors()[0]['msg']}") from None
    return out


def variants(sweep: SweepConfig) -> list[TrainConfig]:
    """Every grid point's TrainConfig (see `variant_points` for their prompt styles)."""
    return [cfg for cfg, _ in variant_points(sweep)]
