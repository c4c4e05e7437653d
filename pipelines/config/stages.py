"""The settings of the flywheel's stages: data quality, training, evaluation, the serving benchmark, drift, the
promotion gate and the gateway."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator

from pipelines.config.base import REPO_ROOT, _Section

Decoding = Literal["served", "off", "on", "both"]
Decoded = Literal["off", "on", "both"]  # a setting resolved: `served` as the way models are served
ToolMetric = Literal["exact_match", "text_f1", "arg_f1"]
LabelSource = Literal["teacher", "human", "import", "generated", "verified"]


# a resolved setting: decode under the grammar?
DECODINGS: dict[Decoded, list[bool]] = {"off": [False], "on": [True], "both": [False, True]}


def decoding_modes(setting: Decoding, served_constrained: bool) -> Decoded:
    """`served` (the default of evaluation and bench) as off/on: the way models are served
    (`triton.constrained`); off, on and both as they are."""
    if setting == "served":
        return "on" if served_constrained else "off"
    return setting


class EvaluationSettings(_Section):
    """Evaluation: how many test requests, which conditions, and how answers are decoded and judged."""

    examples: int = Field(
        default=96,
        ge=1,
        description="the ceiling of test requests per evaluation (a seeded sample, "
        "stratified by tool): the DAG starts with `first_examples` and doubles the sample while "
        "the paired gate is undecided, up to this many",
    )
    first_examples: int = Field(
        default=24,
        ge=1,
        description="the first sample of the DAG's evaluation; every condition "
        "is evaluated on it, a larger sample only re-runs the two the gate compares",
    )
    shots: int = Field(default=3, ge=0, description="in-context examples for the base few-shot condition")
    baselines: bool = Field(
        default=True,
        description="also evaluate the base model (zero-shot, few-shot); off skips them "
        "only where no gate needs them (`promotion.baseline: none`)",
    )
    constrained: Decoding = Field(
        default="served",
        description="evaluate each condition decoded the way models are served (`triton.constrained`: "
        "under the tool-call grammar by default, rows named `<condition>_constrained`), unconstrained (off), under "
        "the grammar (on) or both side by side (twice the time: `flywheel eval --constrained both`); the gate "
        "compares the served rows",
    )
    max_new_tokens: int | None = Field(
        default=None,
        ge=8,
        description="generation budget per answer (evaluation and the "
        "sweep's validation); unset: the answer budget of the models evaluated (the "
        "longest training call plus a margin: `toolcall.budget`). Answers that stop "
        "at the budget are counted (`cut_at_max_new_tokens`) and reported",
    )
    share_prefix: bool = Field(
        default=True,
        description="compute the opening all requests of a decoding call share (system prompt, offered tools' "
        "schemas: an evaluation condition, the sweep's validation, an episodes step) once and decode every batch "
        "from its cache: the "
        "answers of the whole prompts up to rounding, with less prefill; off: every request prefilled whole. The "
        "single-request latency sample never shares it",
    )
    judge_url: str | None = Field(default=None, description="OpenAI-compatible endpoint for an optional LLM-as-judge")
    judge_model: str | None = Field(
        default=None, description="the model name sent to the optional LLM-as-judge endpoint (judge_url)"
    )
    judge_api_key: SecretStr | None = Field(default=None, description="the bearer key sent to the judge endpoint")


class BenchSettings(_Section):
    """The serving benchmark (`flywheel bench`, the DAG's benchmark task) and the hardware table that prices it."""

    requests: int = Field(default=8, ge=1, description="test-split requests replayed per model and concurrency level")
    concurrency: list[int] = Field(default_factory=lambda: [1, 4], description="requests in flight, per level")
    shots: int = Field(default=3, ge=0, description="in-context examples of the base-model baseline")
    protocol: Literal["http", "grpc"] = Field(
        default="http", description="how the benchmark calls Triton: http or grpc"
    )
    constrained: Decoding = Field(
        default="served",
        description="time each model decoded the way models are served (`triton.constrained`), "
        "unconstrained (off), under the tool-call grammar (on), or both (rows side by side); the headline "
        "comparison uses the served rows",
    )
    direct: bool = Field(default=True, description="also time in-process inference (Triton's overhead)")
    baseline: bool = Field(
        default=True,
        description="time the base + few-shot baseline beside the live model (off: the live model, and its "
        "precisions, only; no headline comparison)",
    )
    precisions: list[Literal["fp32", "bf16", "auto"]] = Field(
        default_factory=list,
        description="also time the live version at each of these precisions (`triton.precision`), side by side on "
        "the same requests: a copy of its folder at each precision it is not served at, loaded for the benchmark "
        "and unloaded after; throughput, TTFT and ITL against fp32's, exact match paired per request. Empty: the "
        "served precision only",
    )
    after_deploy: bool = Field(
        default=True,
        description="the DAG benchmarks the live model after each deployment (off: "
        "its benchmark task records that it was skipped; `flywheel bench` still runs)",
    )
    hardware: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="overrides of the hardware table that prices throughput and training time (name -> fields, "
        'e.g. {"h100": {"usd_per_hour": 2.1, "price_source": "our contract"}}); also read from the JSON '
        "in FLYWHEEL_HARDWARE_JSON",
    )
    aiperf: str | None = Field(
        default=None,
        description="the NVIDIA AIPerf executable `bench/aiperf.py` runs (default: the repository's .venv-aiperf, "
        "`make aiperf-env`); also read from FLYWHEEL_AIPERF",
    )

    @field_validator("precisions")
    @classmethod
    def _distinct(cls, precisions: list[str]) -> list[str]:
        return list(dict.fromkeys(precisions))

    @field_validator("concurrency")
    @classmethod
    def _positive_levels(cls, levels: list[int]) -> list[int]:
        if not levels or any(level < 1 for level in levels):
            raise ValueError("concurrency levels must be positive integers")
        return sorted(set(levels))


class DriftSettings(_Section):
    """The drift monitor: the window it checks, each signal's watch and act thresholds, and its cooldown."""

    window_days: int = Field(default=1, ge=1, description="the latest days of raw logs the monitor compares")
    min_records: int = Field(default=200, ge=1, description="fewer clean records than this: no verdict")
    psi_watch: float = Field(
        default=0.1, ge=0, description="population stability index of a signal at which the monitor says `watch`"
    )
    psi_act: float = Field(
        default=0.25, ge=0, description="population stability index at which the monitor alerts (and retrains)"
    )
    auc_watch: float = Field(default=0.65, ge=0.5, le=1, description="domain classifier ROC AUC on request embeddings")
    auc_act: float = Field(
        default=0.8,
        ge=0.5,
        le=1,
        description="domain classifier ROC AUC on request embeddings at which the monitor alerts",
    )
    invalid_call_rate_act: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="share of served answers that are not valid tool calls at which the monitor alerts",
    )
    thumbs_down_rate_act: float = Field(
        default=0.25, ge=0, le=1, description="share of rated answers rated down at which the monitor alerts"
    )
    latency_slo_ms: float = Field(
        default=4000, gt=0, description="the latency objective a served turn is checked against"
    )
    latency_slo_violation_act: float = Field(
        default=0.2, ge=0, le=1, description="share of turns over latency_slo_ms at which the monitor alerts"
    )
    numeric_bins: int = Field(default=10, ge=2, description="bins of the numeric signals' histograms (PSI)")
    min_signal_count: int = Field(
        default=100,
        ge=1,
        description="a numeric signal with fewer values on either side is "
        "not judged (binned PSI on a few dozen values is noise)",
    )
    numeric_sample: int = Field(default=2000, ge=10, description="values sampled per numeric signal and side")
    embedding_sample: int = Field(
        default=300, ge=20, description="requests embedded per side for the domain classifier"
    )
    cooldown_hours: float = Field(
        default=6, ge=0, description="after an emitted alert, further alerts are recorded, not emitted"
    )
    state_lock_timeout_s: float = Field(default=60, gt=0, description="the longest wait for the monitor's state lock")
    parse_cache: bool = Field(
        default=True,
        description="keep each raw file's parse (keyed by its content hash, under reports/drift/parsed/): a check "
        "parses only the files that arrived or changed since the last",
    )
    parse_workers: int = Field(
        default=0,
        ge=0,
        description="processes parsing a window's raw lines (0: the physical "
        "cores, at most 8; 1: in the monitor's process)",
    )
    parse_chunk_lines: int = Field(
        default=20_000, ge=100, description="raw lines per parse task; a window of one chunk is parsed in-process"
    )
    parse_timeout_s: float = Field(default=900, gt=0, description="the longest wait for one parsed chunk")
    retrain_reference_share: float = Field(
        default=0.3,
        ge=0,
        le=1,
        description="share of the reference window mixed into a drift retrain's training window",
    )


class EpisodeSettings(_Section):
    """Whole conversations against a live environment (`flywheel eval --episodes`, the gate's episode rule):
    teacher-forced steps and closed-loop episodes judged by the state they leave."""

    environment: str = Field(
        default="retail",
        description="the environment the tools run against: a registered toolset's name (retail: tau-bench "
        "retail's tools over its db.json) or `package.module:Class` for a project's own",
    )
    db: str | None = Field(default=None, description="the environment's database file (tau-bench's db.json)")
    tools: str | None = Field(
        default=None, description="the tools file (OpenAI tool specs) the episodes offer (tau-bench's schema file)"
    )
    tasks: str | None = Field(
        default=None,
        description="the task file the gate's episode rule runs (tau-bench task lines); unset: no episode rule",
    )
    shot_tasks: str | None = Field(
        default=None,
        description="tasks (never evaluated) whose gold trajectories are the base few-shot condition's examples",
    )
    k: int = Field(default=4, ge=1, le=16, description="sampled tries per task for pass^k in the closed loop")
    temperature: float = Field(default=1.0, gt=0, le=2, description="sampling temperature of the k tries")
    max_steps_factor: float = Field(
        default=2.0, gt=0, description="a closed-loop episode stops after this many times the gold length"
    )
    time_budget_s: float = Field(
        default=3600.0, gt=0, description="an episode run stops after this long, with what it finished, saying so"
    )
    margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="the gate's non-inferiority margin on the closed-loop success rate (paired per task)",
    )
    wrong_write_margin: int = Field(
        default=0, ge=0, description="wrong writes over all episodes the candidate may make beyond the reference's"
    )


class PromotionSettings(_Section):
    """The gate that moves `champion` (pipelines.registry.models.gate): on the same requests, the
    candidate beats the reference by these margins, is not slower, and no tool regresses beyond
    `max_tool_regression`. The reference is the champion; with none yet, the `baseline` condition
    (the base model with retrieved in-context examples, the serving alternative to a tuned model)."""

    rule: Literal["paired", "point"] = Field(
        default="paired",
        description="paired: decide on the paired 95 % interval of the task-score difference on the same "
        "requests (superior, non-inferior and cheaper, inferior, or undecided: evaluate more); point: the older "
        "point comparison with `min_score_gain` (also used for rows without per-request scores)",
    )
    non_inferiority_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="quality held: the paired interval's lower "
        "bound of the task-score difference stays above -margin (README, the gate)",
    )
    min_cost_gain: float = Field(
        default=0.10,
        ge=0,
        le=1,
        description="non-inferior is promoted only when p50 latency or "
        "prompt tokens per request fall by this share (equal cost: no reason to change)",
    )
    confidence: float = Field(default=0.95, gt=0.5, lt=1, description="the paired intervals' level")
    bootstrap_resamples: int = Field(
        default=2000, ge=200, le=100_000, description="resamples of the paired bootstrap interval"
    )
    min_score_gain: float = Field(
        default=0.02,
        ge=-1,
        le=1,
        description="point rule only: least rise of the task score: each "
        "tool's metric (`tool_metrics`; exact match by default) averaged over the examples",
    )
    min_arg_f1_gain: float = Field(default=0.0, ge=-1, le=1, description="point rule only")
    sft_rule: bool = Field(
        default=True,
        description="a candidate a tune method trained must also be non-inferior (the paired task score, "
        "non_inferiority_margin) to the SFT adapter it started from (`tuned_sft`), with no more wrong writes; "
        "off: only reported",
    )
    max_extra_wrong_writes: int = Field(
        default=0,
        ge=0,
        description="wrong writes (a write tool the request did not ask "
        "for, or other ids) the candidate may make beyond the reference's on the same "
        "requests; more vetoes the promotion whatever its task score",
    )
    max_latency_increase: float = Field(
        default=0.10, ge=0, description="tolerated p50 latency increase (measurement noise)"
    )
    max_tool_regression: float = Field(
        default=0.20,
        ge=0,
        le=1,
        description="largest tolerated drop of one tool's exact "
        "match against the reference (no tool may collapse while the average rises)",
    )
    min_tool_examples: int = Field(
        default=5,
        ge=1,
        description="a tool is checked when both rows have this many of its "
        "examples (fewer is noise: one example of 3 is a 0.33 swing)",
    )
    tool_metrics: dict[str, ToolMetric] = Field(
        default_factory=lambda: dict[str, ToolMetric](search_products="text_f1"),
        description="the metric the per-tool regression check compares for a tool (every tool not named: "
        "exact_match); text_f1 (token F1 of string arguments) for free-text arguments such as a search query, "
        "exact_match where ids must be exact (orders)",
    )
    baseline: Literal["base_few_shot", "none"] = Field(
        default="base_few_shot",
        description="with no champion yet, beat this evaluation row; `none` promotes the first "
        "candidate unchecked (plumbing smoke tests with an untrained model only)",
    )


class QualitySettings(_Section):
    """Great Expectations gate thresholds: per-record problems are quarantined by prep; a batch
    whose share of problems passes these limits stops the flywheel before training."""

    raw_mostly: float = Field(default=0.9, gt=0, le=1, description="share of raw lines that must pass each raw check")
    max_quarantined_share: float = Field(
        default=0.2, ge=0, le=1, description="largest share of a batch prep may quarantine"
    )
    min_examples_per_tool: int = Field(
        default=5,
        ge=0,
        description="a window whose training split has fewer examples of an offered tool fails the gate",
    )
    min_approx_tokens: int = Field(
        default=16, ge=0, description="shortest example (prep's approx_tokens) the gate accepts"
    )
    max_approx_tokens: int | None = Field(
        default=None,
        ge=1,
        description="longest example (prep's approx_tokens); unset: "
        "the base model's context window minus the window's answer budget",
    )
    train_label_sources: list[LabelSource] = Field(
        default_factory=lambda: list[LabelSource](["teacher", "human", "import", "generated"]),
        description="label sources that train "
        "(prep.labels); our own models' answers train only when a person rated them up; a down-rated one never; "
        "`verified` (our model's episodes the environment judged successful, `flywheel eval --episodes "
        "--keep-successes`) trains only when named here",
    )
    late_label_days: int = Field(
        default=30,
        ge=0,
        le=365,
        description="a turn logged up to this many days before a window and rated during it is prepared with the "
        "window (prep.late): a late thumbs-up trains it, a late thumbs-down sends it to review; 0: ratings count "
        "only when their turn's own day is prepared",
    )
    min_trusted_label_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="smallest share of a window's examples whose label our own model did not "
        "write (teacher, human, import, generated): the gate fails a window that would mostly retrain the champion "
        "on its own answers, even confirmed ones",
    )


class TrainSettings(_Section):
    """Where and how sweeps train; the sweep file holds the hyperparameters."""

    sweep: str = Field(default=str(REPO_ROOT / "conf" / "sweeps" / "demo.yaml"), description="default sweep file")
    drift_sweep: str | None = Field(
        default=str(REPO_ROOT / "conf" / "sweeps" / "drift.yaml"),
        description="the (smaller) sweep a drift-triggered retrain runs; None: `sweep`",
    )
    backend: Literal["hf", "nemo"] | None = Field(default=None, description="override the sweep file's backend")
    precision: Literal["fp32", "bf16"] = Field(
        default="bf16",
        description="the hf backend's compute on CPU: bf16 (the frozen base in bf16, matmuls under bf16 autocast on "
        "AVX-512 BF16 / AMX; the adapter's master weights and the optimizer state stay fp32) or fp32; a GPU trains "
        "in bf16 either way; a CPU without bf16 units (AVX-512 BF16 or AMX) trains in fp32 whatever this says "
        "(emulated bf16 is many times slower). The default is the measured choice on a CPU with AMX "
        "(bench/train.py --precision fp32,bf16; the benchmarks page)",
    )
    runner: Literal["local", "kubernetes"] = Field(default="local", description="local process, or one pod per variant")
    nemo_python: str = Field(
        default=str(REPO_ROOT / ".venv-nemo" / "bin" / "python"),
        description="interpreter of the NeMo AutoModel environment (make nemo-env)",
    )
    variant_timeout_s: float = Field(
        default=6 * 3600,
        gt=0,
        description="longest one variant's training process may run "
        "(NeMo AutoModel launch) before it is stopped; it resumes from its checkpoints",
    )
