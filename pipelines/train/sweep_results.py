"""What a sweep records: its results (`VariantResult`, `SweepResult`) and each variant's measurements
(validation metrics, hardware, peak memory)."""

from __future__ import annotations

import platform
import resource
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.config import Settings
from pipelines.errors import NotRetryable

SELECT_METRICS = ("exact_match", "arg_f1", "name_accuracy")


@dataclass
class VariantResult:
    index: int
    run_id: str
    params: dict[str, Any]
    status: str
    adapter_dir: str
    metrics: dict[str, float] = field(default_factory=dict)
    prompt_style: str = ""  # the prompt it trained and was validated with (empty: the sweep's, older results)


@dataclass
class SweepResult:
    sweep_id: str
    name: str
    backend: str
    parent_run_id: str
    dataset_digest: str
    prompt_style: str
    base_model: str
    variants: list[VariantResult]
    best: int | None
    uri: str = ""
    window: str | None = None  # the training set's window label (START_END): evaluation and lineage use it
    answer_budget: int | None = None  # tokens a call may take: the longest training target + a margin

    @property
    def best_variant(self) -> VariantResult:
        if self.best is None:
            raise NotRetryable(f"sweep {self.sweep_id}: every variant diverged; nothing to register")
        return self.variants[self.best]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def hardware() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    return f"CPU {platform.machine()} x{torch.get_num_threads()} threads"


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak RSS (KiB on Linux)


def validation_metrics(
    settings: Settings, base_model: str, adapter_dir: str, val: list[Any], budget: int
) -> dict[str, float]:
    """Generation on the validation split, decoded as models are served (`triton.constrained`: under the
    offered tools' grammar; at the served precision) within the answer budget: the sweep's selection metric (no
    latency timing here)."""
    from pipelines.base_models import load_as_served
    from pipelines.logs.toolsets import tool_effects
    from pipelines.toolcall import score as m
    from pipelines.toolcall.decode import generate
    from pipelines.toolcall.examples import grounded_tools

    try:
        effects = tool_effects(settings.zone("raw"))
    except Exception:  # noqa: BLE001 (a training pod's role reads curated only: the catalogue's effects, undeclared = write)
        effects = None
    model, tokenizer = load_as_served(base_model, settings, adapter_dir, what="the sweep's validation")
    out = generate(
        model,
        tokenizer,
        [e.turns for e in val],
        latency_samples=0,
        max_new_tokens=settings.evaluation.max_new_tokens or budget,
        tools=grounded_tools(val, effects, settings.triton.grounded_ids) if settings.triton.constrained else None,
        share_prefix=settings.evaluation.share_prefix,
    )
    summary = m.summarize([m.score(t, e.expected, effects) for t, e in zip(out.texts, val)])
    return {f"val_{k}": float(summary[k] or 0.0) for k in SELECT_METRICS + ("json_valid", "wrong_writes")}
