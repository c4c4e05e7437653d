"""The settings sections of evaluation, benchmarks, drift and the promotion gate (`pipelines.config`
holds the one `Settings` object; its sections live here and there so neither file grows past a room)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


Decoding = Literal["served", "off", "on", "both"]


DECODINGS = {"off": [False], "on": [True], "both": [False, True]}  # a resolved setting: decode under the grammar?


def decoding_modes(setting: str, served_constrained: bool) -> str:
    """`served` (the default of evaluation and bench) as off/on: the way models are served
    (`triton.constrained`); off, on and both as they are."""
    if setting == "served":
        return "on" if served_constrained else "off"
    return setting


class EvaluationSettings(_Section):
    examples: int = Field(96, ge=1, description="the ceiling of test requests per evaluation (a seeded sample, "
                          "stratified by tool): the DAG starts with `first_examples` and doubles the sample while "
                          "the paired gate is undecided, up to this many")
    first_examples: int = Field(24, ge=1, description="the first sample of the DAG's evaluation; every condition "
                                "is evaluated on it, a larger sample only re-runs the two the gate compares")
    shots: int = Field(3, ge=0, description="in-context examples for the base few-shot condition")
    baselines: bool = Field(True, description="also evaluate the base model (zero-shot, few-shot); off skips them "
                            "only where no gate needs them (`promotion.baseline: none`)")
    constrained: Decoding = Field(
        "served", description="evaluate each condition decoded the way models are served (`triton.constrained`: "
        "under the tool-call grammar by default, rows named `<condition>_constrained`), unconstrained (off), under "
        "the grammar (on) or both side by side (twice the time: `flywheel eval --constrained both`); the gate "
        "compares the served rows")
    max_new_tokens: int | None = Field(None, ge=8, description="generation budget per answer (evaluation and the "
                                       "sweep's validation); unset: the answer budget of the models evaluated (the "
                                       "longest training call plus a margin: `toolcall.budget`). Answers that stop "
                                       "at the budget are counted (`cut_at_max_new_tokens`) and reported")
    judge_url: str | None = Field(None, description="OpenAI-compatible endpoint for an optional LLM-as-judge")
    judge_model: str | None = None
    judge_api_key: SecretStr | None = None


class BenchSettings(_Section):
    requests: int = Field(8, ge=1, description="test-split requests replayed per model and concurrency level")
    concurrency: list[int] = Field(default_factory=lambda: [1, 4], description="requests in flight, per level")
    shots: int = Field(3, ge=0, description="in-context examples of the base-model baseline")
    protocol: Literal["http", "grpc"] = "http"
    constrained: Decoding = Field(
        "served", description="time each model decoded the way models are served (`triton.constrained`), "
        "unconstrained (off), under the tool-call grammar (on), or both (rows side by side); the headline "
        "comparison uses the served rows")
    direct: bool = Field(True, description="also time in-process inference (Triton's overhead)")
    after_deploy: bool = Field(True, description="the DAG benchmarks the live model after each deployment (off: "
                               "its benchmark task records that it was skipped; `flywheel bench` still runs)")

    @field_validator("concurrency")
    @classmethod
    def _positive_levels(cls, levels: list[int]) -> list[int]:
        if not levels or any(level < 1 for level in levels):
            raise ValueError("concurrency levels must be positive integers")
        return sorted(set(levels))


class DriftSettings(_Section):
    window_days: int = Field(1, ge=1, description="the latest days of raw logs the monitor compares")
    min_records: int = Field(200, ge=1, description="fewer clean records than this: no verdict")
    psi_watch: float = Field(0.1, ge=0)
    psi_act: float = Field(0.25, ge=0)
    auc_watch: float = Field(0.65, ge=0.5, le=1, description="domain classifier ROC AUC on request embeddings")
    auc_act: float = Field(0.8, ge=0.5, le=1)
    invalid_call_rate_act: float = Field(0.1, ge=0, le=1)
    thumbs_down_rate_act: float = Field(0.25, ge=0, le=1)
    latency_slo_ms: float = Field(4000, gt=0)
    latency_slo_violation_act: float = Field(0.2, ge=0, le=1)
    numeric_bins: int = Field(10, ge=2)
    min_signal_count: int = Field(100, ge=1, description="a numeric signal with fewer values on either side is "
                                  "not judged (binned PSI on a few dozen values is noise)")
    numeric_sample: int = Field(2000, ge=10)
    embedding_sample: int = Field(300, ge=20)
    cooldown_hours: float = Field(6, ge=0, description="after an emitted alert, further alerts are recorded, "
                                  "not emitted")
    state_lock_timeout_s: float = Field(60, gt=0, description="the longest wait for the monitor's state lock")
    parse_workers: int = Field(0, ge=0, description="processes parsing a window's raw lines (0: the physical "
                               "cores, at most 8; 1: in the monitor's process)")
    parse_chunk_lines: int = Field(20_000, ge=100, description="raw lines per parse task; a window of one chunk "
                                   "is parsed in-process")
    parse_timeout_s: float = Field(900, gt=0, description="the longest wait for one parsed chunk")
    retrain_reference_share: float = Field(0.3, ge=0, le=1, description="share of the reference window mixed "
                                           "into a drift retrain's training window")


class PromotionSettings(_Section):
    """The gate that moves `champion` (pipelines.registry.models.gate): on the same requests, the
    candidate beats the reference by these margins, is not slower, and no tool regresses beyond
    `max_tool_regression`. The reference is the champion; with none yet, the `baseline` condition
    (the base model with retrieved in-context examples, the serving alternative to a tuned model)."""

    rule: Literal["paired", "point"] = Field(
        "paired", description="paired: decide on the paired 95 % interval of the task-score difference on the same "
        "requests (superior, non-inferior and cheaper, inferior, or undecided: evaluate more); point: the older "
        "point comparison with `min_score_gain` (also used for rows without per-request scores)")
    non_inferiority_margin: float = Field(0.05, ge=0, le=1, description="quality held: the paired interval's lower "
                                          "bound of the task-score difference stays above -margin (README, the gate)")
    min_cost_gain: float = Field(0.10, ge=0, le=1, description="non-inferior is promoted only when p50 latency or "
                                 "prompt tokens per request fall by this share (equal cost: no reason to change)")
    confidence: float = Field(0.95, gt=0.5, lt=1, description="the paired intervals' level")
    bootstrap_resamples: int = Field(2000, ge=200, le=100_000)
    min_score_gain: float = Field(0.02, ge=-1, le=1, description="point rule only: least rise of the task score: each "
                                  "tool's metric (`tool_metrics`; exact match by default) averaged over the examples")
    min_arg_f1_gain: float = Field(0.0, ge=-1, le=1, description="point rule only")
    max_extra_wrong_writes: int = Field(0, ge=0, description="wrong writes (a write tool the request did not ask "
                                        "for, or other ids) the candidate may make beyond the reference's on the same "
                                        "requests; more vetoes the promotion whatever its task score")
    max_latency_increase: float = Field(0.10, ge=0, description="tolerated p50 latency increase (measurement noise)")
    max_tool_regression: float = Field(0.20, ge=0, le=1, description="largest tolerated drop of one tool's exact "
                                       "match against the reference (no tool may collapse while the average rises)")
    min_tool_examples: int = Field(5, ge=1, description="a tool is checked when both rows have this many of its "
                                   "examples (fewer is noise: one example of 3 is a 0.33 swing)")
    tool_metrics: dict[str, Literal["exact_match", "text_f1", "arg_f1"]] = Field(
        default_factory=lambda: {"search_products": "text_f1"},
        description="the metric the per-tool regression check compares for a tool (every tool not named: "
        "exact_match); text_f1 (token F1 of string arguments) for free-text arguments such as a search query, "
        "exact_match where ids must be exact (orders)")
    baseline: Literal["base_few_shot", "none"] = Field(
        "base_few_shot", description="with no champion yet, beat this evaluation row; `none` promotes the first "
        "candidate unchecked (plumbing smoke tests with an untrained model only)")
