"""LoRA sweeps: a grid or random search over TrainConfig fields, one MLflow child run per variant
under a sweep parent run, each variant scored on the validation split; the best one is the candidate.

A sweep is identified by its file's content and the training set's digest, so a retried task finds
its parent run, skips finished variants and resumes an interrupted one from its checkpoint.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import platform
import random
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.console import Console

from pipelines.base_models import answer_budget_of
from pipelines.config import ConfigError, Settings
from pipelines.errors import NotRetryable
from pipelines.storage import write_json
from pipelines.toolcall.budget import TAG as BUDGET_TAG
from pipelines.train.hf_backend import TrainConfig, TrainResult, epochs_seen, steps_for

SELECT_METRICS = ("exact_match", "arg_f1", "name_accuracy")
PROMPT_STYLES = ("names", "short", "full")


class SweepConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    backend: Literal["hf", "nemo"] = "hf"
    method: Literal["grid", "random"] = "grid"
    samples: int | None = Field(None, ge=1, description="random search: how many variants")
    seed: int = 0
    base: TrainConfig = Field(default_factory=TrainConfig)
    grid: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="TrainConfig field -> values; also "
        "`prompt_style` (names, short, full): the data decides the prompt",
    )
    prompt_style: Literal["short", "names", "full"] = Field(
        "short", description="the prompt every variant trains with, unless the grid varies `prompt_style`"
    )
    train_examples: int | None = Field(None, ge=1, description="seeded sample of the train split; None = all")
    train_sampling: Literal["random", "balanced", "sqrt"] = Field(
        "sqrt",
        description="how `train_examples` are drawn over (tool, source) strata: `sqrt` gives each a share "
        "that grows with the square root of its size (a large source keeps more than an equal share, a rare tool "
        "far more than its random share), `balanced` equal shares, `random` the window's mix; a stratum with "
        "fewer rows than its share gives all it has",
    )
    val_examples: int = Field(
        16,
        ge=1,
        description="validation requests, stratified by tool and source (every "
        "stratum at least once while the count allows): the variant is selected on them",
    )
    select_metric: Literal["exact_match", "arg_f1", "name_accuracy"] = "exact_match"
    tensor_parallel_size: int = Field(1, ge=1, description="NeMo on GPUs: tensor-parallel size per variant")
    gpus_per_variant: int = Field(1, ge=1)

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


def variant_points(sweep: SweepConfig) -> list[tuple[TrainConfig, str]]:
    """Every grid point (or a seeded random sample of them): its TrainConfig and its prompt style."""
    keys = sorted(sweep.grid)
    points = [dict(zip(keys, values)) for values in itertools.product(*(sweep.grid[k] for k in keys))] or [{}]
    if sweep.method == "random":
        points = random.Random(sweep.seed).sample(points, min(sweep.samples or 1, len(points)))
    base = sweep.base.model_dump()
    out = []
    for point in points:
        style = str(point.pop("prompt_style", sweep.prompt_style))
        try:
            out.append((TrainConfig.model_validate({**base, **point}), style))
        except ValidationError as exc:
            raise ConfigError(f"sweep {sweep.name}: variant {point}: {exc.errors()[0]['msg']}") from None
    return out


def variants(sweep: SweepConfig) -> list[TrainConfig]:
    """Every grid point's TrainConfig (see `variant_points` for their prompt styles)."""
    return [cfg for cfg, _ in variant_points(sweep)]


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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepResult:
        return cls(**{**data, "variants": [VariantResult(**v) for v in data["variants"]]})


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


def _flat_params(cfg: TrainConfig) -> dict[str, str]:
    return {k: ",".join(v) if isinstance(v, list) else str(v) for k, v in cfg.model_dump().items()}


def _label(window: Any) -> str | None:
    """A manifest's window as its label (`START_END`), as prep names the window's manifest."""
    if isinstance(window, dict) and window.get("start") and window.get("end"):
        return f"{window['start']}_{window['end']}"
    return None


def sweep_id_for(
    settings: Settings, sweep: SweepConfig, reference_days: list[str] | None = None, window: str | None = None
) -> str:
    """The sweep file's content and the training set's digest: the same pair is the same sweep. A drift
    retrain (`reference_days`) mixes a sample of those days into its training rows, so the days (sorted)
    and the mixed share are part of its id: it never reuses variants trained without that mix."""
    from pipelines.prep.dataset import manifest

    sweep_id = f"{sweep.name}-{sweep.digest()}-{manifest(settings, window)['training_set']['digest'][:10]}"
    if reference_days:
        mix = json.dumps({"days": sorted(set(reference_days)), "share": settings.drift.retrain_reference_share})
        sweep_id += f"-ref{hashlib.sha256(mix.encode()).hexdigest()[:8]}"
    return sweep_id


def work_folder(settings: Settings, sweep_id: str) -> Path:
    """Checkpoints and adapters of a sweep: under the root locally, a local scratch folder when the
    root is object storage (the adapters themselves are in MLflow's artifact store)."""
    base = (
        Path(settings.project_root())
        if "://" not in str(settings.root)
        else Path.home() / ".flywheel" / ("" if settings.project == "default" else f"projects/{settings.project}")
    )
    return base / "training" / sweep_id  # a project's own: two projects never share checkpoints


def run_sweep(
    settings: Settings,
    sweep: SweepConfig,
    console: Console | None = None,
    reference_days: list[str] | None = None,
    only: list[int] | None = None,
    window: str | None = None,
) -> SweepResult:
    """Train every variant (one after another here; one pod each on a cluster), score each on the
    validation split, log all of it to MLflow, and pick the best by `select_metric`.

    With `train.runner=kubernetes` the variants were trained by the DAG's pods: this collects them
    from MLflow (their child runs and adapters) instead of training. `only`: the variants to train
    (a pod trains one); the best is picked when the whole sweep is there."""
    import mlflow
    from pipelines.clients.mlflow import use_tracking
    from pipelines.prep.dataset import load_split, manifest, with_reference_sample
    from pipelines.toolcall.examples import to_examples, training_pairs

    console = console or Console()
    lineage = manifest(settings, window)  # read once: the whole sweep trains on this window's training set
    window = window or _label(lineage.get("window"))
    digest = lineage["training_set"]["digest"]
    sweep_id = sweep_id_for(settings, sweep, reference_days, window)
    folder = work_folder(settings, sweep_id)
    points = variant_points(sweep)
    configs = [cfg for cfg, _ in points]
    styles = sorted({style for _, style in points})
    collect = settings.train.runner == "kubernetes"
    experiment_id = use_tracking(settings)
    parent_id = find_or_start_run(
        experiment_id, {"flywheel.sweep_id": sweep_id, "flywheel.kind": "sweep"}, f"sweep {sweep.name}"
    )
    results: list[VariantResult] = []
    with mlflow.start_run(run_id=parent_id):
        if not collect:
            rows = load_split(settings, "train", sweep.train_examples, sweep.seed, window, sweep.train_sampling)
            if reference_days:  # a drift retrain: the recent window plus a sample of the champion's training window
                rows = with_reference_sample(
                    settings, rows, reference_days, settings.drift.retrain_reference_share, sweep.seed
                )
            val_rows = load_split(settings, "val", sweep.val_examples, sweep.seed, window, "stratified")
            # the same rows in each prompt style the grid names: variants of different styles are compared on
            # the same validation requests
            train = {style: training_pairs(to_examples(rows, style)) for style in styles}
            val = {style: to_examples(val_rows, style) for style in styles}
            budget = answer_budget_of(settings, sweep.base.base_model, [t for p in train.values() for _, t in p])
            if settings.triton.constrained:  # validation decodes under the grammar: refuse before training
                from pipelines.toolcall.decode import require_grammars

                require_grammars(
                    set(val_rows["tools_json"]),
                    "sweep validation decodes under the offered tools' grammar (triton.constrained)",
                    "set triton.constrained: false to train and serve without it",
                )
            mlflow.log_params(
                {
                    "sweep": sweep.name,
                    "backend": sweep.backend,
                    "method": sweep.method,
                    "variants": len(configs),
                    "prompt_style": ",".join(styles),
                    "train_sampling": sweep.train_sampling,
                    "val_sampling": "stratified",
                    "base_model": sweep.base.base_model,
                    "train_examples": len(rows),
                    "val_examples": len(val_rows),
                    "dataset_digest": digest,
                    BUDGET_TAG: budget,
                }
            )
            mlflow.log_dict(sweep.model_dump(mode="json"), "sweep.json")
        for index, (cfg, style) in enumerate(points):
            if only is not None and index not in only:
                continue
            if collect:
                results.append(_collect_variant(sweep_id, index, folder, experiment_id, style))
                continue
            console.print(
                f"[bold]variant {index + 1}/{len(configs)}[/bold] "
                + ", ".join(f"{k}={style if k == 'prompt_style' else getattr(cfg, k)}" for k in sorted(sweep.grid))
            )
            results.append(
                _run_variant(
                    settings,
                    sweep,
                    sweep_id,
                    index,
                    cfg,
                    style,
                    train[style],
                    val[style],
                    folder,
                    experiment_id,
                    parent_id,
                    console,
                    budget,
                )
            )
        finished = [r for r in results if r.status == "completed"]
        best = max(
            finished,
            key=lambda r: (r.metrics.get(f"val_{sweep.select_metric}", 0.0), -r.metrics.get("final_loss", 0.0)),
            default=None,
        )
        if only is not None:  # one pod's share of the sweep: the collector picks the best
            best = None
        elif best is not None:
            mlflow.log_metrics({f"best_val_{sweep.select_metric}": best.metrics[f"val_{sweep.select_metric}"]})
            mlflow.set_tags({"flywheel.best_run_id": best.run_id, "flywheel.best_variant": str(best.index)})
    # the sweep's prompt style is its best variant's: evaluation, the registry and serving use that one
    style = (best.prompt_style or sweep.prompt_style) if best is not None else sweep.prompt_style
    if collect:  # the pods measured it from the same training rows: their parent run's param
        budget = int(mlflow.MlflowClient().get_run(parent_id).data.params.get(BUDGET_TAG, 0)) or None
    result = SweepResult(
        sweep_id,
        sweep.name,
        sweep.backend,
        parent_id,
        digest,
        style,
        sweep.base.base_model,
        results,
        results.index(best) if best else None,
        window=window,
        answer_budget=budget,
    )
    result.uri = write_json(str(folder / "sweep.json"), result.to_dict())
    return result


def _collect_variant(sweep_id: str, index: int, folder: Path, experiment_id: str, style: str) -> VariantResult:
    """A variant a pod trained: its finished child run, and its adapter fetched from the artifact store."""
    import mlflow

    query = f"tags.`flywheel.sweep_id` = '{sweep_id}' and tags.`flywheel.variant` = '{index}'"
    found = mlflow.MlflowClient().search_runs([experiment_id], query, max_results=1)
    if not found or "flywheel.status" not in found[0].data.tags:
        raise NotRetryable(
            f"sweep {sweep_id}: variant {index} has no finished run; its pod (task train_variant) did not complete"
        )
    run = found[0]
    status = run.data.tags["flywheel.status"]
    adapter_dir = ""
    if status == "completed":
        out = folder / f"variant-{index:02d}"
        out.mkdir(parents=True, exist_ok=True)
        adapter_dir = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id, artifact_path="adapter", dst_path=str(out)
        )
    return VariantResult(
        index,
        run.info.run_id,
        dict(run.data.params),
        status,
        adapter_dir,
        dict(run.data.metrics),
        run.data.tags.get("flywheel.prompt_style", style),
    )


def find_or_start_run(experiment_id: str, tags: dict[str, str], name: str, parent_id: str | None = None) -> str:
    """An earlier attempt's run with these tags (a retried task continues it), else a new one."""
    from mlflow import MlflowClient

    client = MlflowClient()
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    found = client.search_runs([experiment_id], query, max_results=1)
    if found:
        return found[0].info.run_id
    all_tags = {**tags, **({"mlflow.parentRunId": parent_id} if parent_id else {})}
    return client.create_run(experiment_id, tags=all_tags, run_name=name).info.run_id


def _run_variant(
    settings: Settings,
    sweep: SweepConfig,
    sweep_id: str,
    index: int,
    cfg: TrainConfig,
    style: str,
    train: list[tuple[list[dict[str, str]], str]],
    val: list[Any],
    folder: Path,
    experiment_id: str,
    parent_id: str,
    console: Console,
    budget: int,
) -> VariantResult:
    import mlflow

    out = folder / f"variant-{index:02d}"
    done = out / "result.json"
    if done.is_file():  # a retried task: this variant finished in an earlier attempt
        console.print(f"  already trained: {done}")
        return VariantResult(**{"prompt_style": style, **json.loads(done.read_text())})
    run_id = find_or_start_run(
        experiment_id,
        {"flywheel.sweep_id": sweep_id, "flywheel.variant": str(index)},
        f"{sweep.name}-{index:02d}",
        parent_id,
    )
    steps = steps_for(cfg, len(train))  # the schedule both backends resolve from the training set's size
    with mlflow.start_run(run_id=run_id, nested=True):
        mlflow.log_params({**_flat_params(cfg), "prompt_style": style})
        mlflow.log_params(
            {"resolved_steps": steps, "resolved_epochs": round(epochs_seen(steps, cfg.batch_size, len(train)), 4)}
        )
        mlflow.set_tags(
            {
                "flywheel.backend": sweep.backend,
                "flywheel.hardware": hardware(),
                "flywheel.base_model": cfg.base_model,
                "flywheel.prompt_style": style,
            }
        )
        client = mlflow.MlflowClient()

        def on_step(step: int, loss: float, lr: float) -> None:
            now = int(time.time() * 1000)
            client.log_batch(
                run_id,
                metrics=[
                    mlflow.entities.Metric("train_loss", loss, now, step),
                    mlflow.entities.Metric("learning_rate", lr, now, step),
                ],
            )

        started = time.perf_counter()
        trained = train_variant(settings, sweep, cfg, train, out, on_step, console)
        wall = time.perf_counter() - started
        metrics = {
            "final_loss": trained.final_loss,
            "tokens_per_s": trained.tokens_per_s,
            "train_tokens": float(trained.tokens),
            "steps": float(trained.steps),
            "epochs_seen": round(epochs_seen(trained.steps, cfg.batch_size, len(train)), 4),
            "resumed_from_step": float(trained.resumed_from),
            "wall_s": round(wall, 1),
            "peak_memory_mb": round(peak_memory_mb(), 1),
        }
        if trained.status == "completed":
            metrics.update(_validate(settings, cfg.base_model, trained.adapter_dir, val, budget))
            mlflow.log_artifacts(trained.adapter_dir, "adapter")
        mlflow.log_metrics(metrics)
        mlflow.set_tag("flywheel.status", trained.status)
    result = VariantResult(index, run_id, _flat_params(cfg), trained.status, trained.adapter_dir, metrics, style)
    done.write_text(json.dumps(asdict(result), indent=2))
    console.print(
        f"  {trained.status}: loss {trained.final_loss:.3f}, {trained.tokens_per_s:.0f} tokens/s, "
        + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items() if k.startswith("val_"))
    )
    return result


def train_variant(
    settings: Settings,
    sweep: SweepConfig,
    cfg: TrainConfig,
    train: list[tuple[list[dict[str, str]], str]],
    out: Path,
    on_step: Any,
    console: Console,
) -> TrainResult:
    """Dispatch to the configured backend; both write an HF-PEFT adapter to `out/adapter`."""
    if sweep.backend == "nemo":
        from pipelines.train.nemo_backend import train_nemo

        return train_nemo(
            settings,
            cfg,
            train,
            out,
            on_step,
            tensor_parallel_size=sweep.tensor_parallel_size,
            gpus=sweep.gpus_per_variant,
            console=console,
        )
    from pipelines.base_models import load_base
    from pipelines.train.hf_backend import train_lora

    return train_lora(train, cfg, out, lambda name: load_base(name, settings), on_step)


def _validate(settings: Settings, base_model: str, adapter_dir: str, val: list[Any], budget: int) -> dict[str, float]:
    """Generation on the validation split, decoded as models are served (`triton.constrained`: under the
    offered tools' grammar) within the answer budget: the sweep's selection metric (no latency timing here)."""
    from pipelines.base_models import load_model
    from pipelines.logs.toolsets import tool_effects
    from pipelines.toolcall import score as m
    from pipelines.toolcall.decode import generate
    from pipelines.toolcall.examples import grounded_tools

    try:
        effects = tool_effects(settings.zone("raw"))
    except Exception:  # noqa: BLE001 (a training pod's role reads curated only: the catalogue's effects, undeclared = write)
        effects = None
    model, tokenizer = load_model(base_model, settings, adapter_dir)
    out = generate(
        model,
        tokenizer,
        [e.turns for e in val],
        latency_samples=0,
        max_new_tokens=settings.evaluation.max_new_tokens or budget,
        tools=grounded_tools(val, effects, settings.triton.grounded_ids) if settings.triton.constrained else None,
    )
    summary = m.summarize([m.score(t, e.expected, effects) for t, e in zip(out.texts, val)])
    return {f"val_{k}": float(summary[k] or 0.0) for k in SELECT_METRICS + ("json_valid", "wrong_writes")}
