"""LoRA sweeps: a grid or random search over TrainConfig fields, one MLflow child run per variant
under a sweep parent run, each variant scored on the validation split; the best one is the candidate.

A sweep is identified by its file's content and the training set's digest, so a retried task finds
its parent run, skips finished variants and resumes an interrupted one from its checkpoint. The sweep
file and its variants: `train.sweep_config`; the results and each variant's measurements:
`train.sweep_results`.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from pipelines.base_models import answer_budget_of
from pipelines.config import Settings
from pipelines.errors import NotRetryable
from pipelines.storage import write_json, write_text
from pipelines.toolcall.budget import TAG as BUDGET_TAG
from pipelines.train.hf_backend import TrainConfig, TrainResult, epochs_seen, steps_for
from pipelines.train.sweep_config import SweepConfig, variant_points
from pipelines.train.sweep_results import SweepResult, VariantResult, hardware, peak_memory_mb, validation_metrics

if TYPE_CHECKING:
    from pipelines.toolcall.prompt import PromptStyle

Pairs = list[tuple[list[dict[str, str]], str]]  # (chat turns, target call) training pairs


@dataclass(frozen=True)
class SweepContext:
    """What every variant of one sweep shares: the sweep and its id, its work folder, its MLflow experiment
    and parent run, the console, and the answer budget its validation decodes within."""

    settings: Settings
    sweep: SweepConfig
    sweep_id: str
    folder: Path
    experiment_id: str
    parent_id: str
    console: Console
    budget: int


@dataclass(frozen=True)
class _SweepData:
    """The sweep's training and validation rows, as pairs and examples in each prompt style, and the budget."""

    rows: Any
    val_rows: Any
    train: dict[PromptStyle, Pairs]
    val: dict[PromptStyle, list[Any]]
    budget: int


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
    from pipelines.prep.dataset import manifest

    console = console or Console()
    lineage = manifest(settings, window)  # read once: the whole sweep trains on this window's training set
    window = window or _label(lineage.get("window"))
    digest = lineage["training_set"]["digest"]
    sweep_id = sweep_id_for(settings, sweep, reference_days, window)
    folder = work_folder(settings, sweep_id)
    points = variant_points(sweep)
    styles = sorted({style for _, style in points})
    collect = settings.train.runner == "kubernetes"
    experiment_id = use_tracking(settings)
    parent_id = find_or_start_run(
        experiment_id, {"flywheel.sweep_id": sweep_id, "flywheel.kind": "sweep"}, f"sweep {sweep.name}"
    )
    results: list[VariantResult] = []
    with mlflow.start_run(run_id=parent_id):
        if not collect:
            data = _training_data(settings, sweep, window, reference_days, styles)
            _log_sweep(sweep, len(points), styles, data, digest)
            context = SweepContext(settings, sweep, sweep_id, folder, experiment_id, parent_id, console, data.budget)
        for index, (cfg, style) in enumerate(points):
            if only is not None and index not in only:
                continue
            if collect:
                results.append(_collect_variant(sweep_id, index, folder, experiment_id, style))
                continue
            console.print(
                f"[bold]variant {index + 1}/{len(points)}[/bold] "
                + ", ".join(f"{k}={style if k == 'prompt_style' else getattr(cfg, k)}" for k in sorted(sweep.grid))
            )
            results.append(_run_variant(context, index, cfg, style, data.train[style], data.val[style]))
        best = _pick_best(results, sweep.select_metric, only)
    # the sweep's prompt style is its best variant's: evaluation, the registry and serving use that one
    chosen_style = (best.prompt_style or sweep.prompt_style) if best is not None else sweep.prompt_style
    if collect:  # the pods measured it from the same training rows: their parent run's param
        budget = int(mlflow.MlflowClient().get_run(parent_id).data.params.get(BUDGET_TAG, 0)) or None
    else:
        budget = data.budget
    result = SweepResult(
        sweep_id,
        sweep.name,
        sweep.backend,
        parent_id,
        digest,
        chosen_style,
        sweep.base.base_model,
        results,
        results.index(best) if best else None,
        window=window,
        answer_budget=budget,
    )
    result.uri = write_json(str(folder / "sweep.json"), result.to_dict())
    return result


def _training_data(
    settings: Settings,
    sweep: SweepConfig,
    window: str | None,
    reference_days: list[str] | None,
    styles: list[PromptStyle],
) -> _SweepData:
    """Load the sweep's training and validation rows in every prompt style, measure the answer budget, and
    refuse before training when validation must decode under a grammar the offered tools cannot have."""
    from pipelines.prep.dataset import load_split, with_reference_sample
    from pipelines.toolcall.examples import to_examples, training_pairs

    rows = load_split(settings, "train", sweep.train_examples, sweep.seed, window, sweep.train_sampling)
    if reference_days:  # a drift retrain: the recent window plus a sample of the champion's training window
        rows = with_reference_sample(settings, rows, reference_days, settings.drift.retrain_reference_share, sweep.seed)
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
    return _SweepData(rows, val_rows, train, val, budget)


def _log_sweep(sweep: SweepConfig, variants: int, styles: list[PromptStyle], data: _SweepData, digest: str) -> None:
    """The sweep's params and its file on the parent run."""
    import mlflow

    mlflow.log_params(
        {
            "sweep": sweep.name,
            "backend": sweep.backend,
            "method": sweep.method,
            "variants": variants,
            "prompt_style": ",".join(styles),
            "train_sampling": sweep.train_sampling,
            "val_sampling": "stratified",
            "base_model": sweep.base.base_model,
            "train_examples": len(data.rows),
            "val_examples": len(data.val_rows),
            "dataset_digest": digest,
            BUDGET_TAG: data.budget,
        }
    )
    mlflow.log_dict(sweep.model_dump(mode="json"), "sweep.json")


def _pick_best(results: list[VariantResult], metric: str, only: list[int] | None) -> VariantResult | None:
    """The completed variant with the best validation `metric` (ties: the lower final loss), logged on the
    parent run; None for one pod's share of the sweep (`only`): the collector picks the best."""
    import mlflow

    finished = [r for r in results if r.status == "completed"]
    best = max(
        finished,
        key=lambda r: (r.metrics.get(f"val_{metric}", 0.0), -r.metrics.get("final_loss", 0.0)),
        default=None,
    )
    if only is not None:
        return None
    if best is not None:
        mlflow.log_metrics({f"best_val_{metric}": best.metrics[f"val_{metric}"]})
        mlflow.set_tags({"flywheel.best_run_id": best.run_id, "flywheel.best_variant": str(best.index)})
    return best


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
    ctx: SweepContext, index: int, cfg: TrainConfig, style: str, train: Pairs, val: list[Any]
) -> VariantResult:
    """Train variant `index` (`cfg`, prompt `style`) in its child run, validate it when it completed, and record
    its result (a retried task returns the one an earlier attempt recorded)."""
    import mlflow

    out = ctx.folder / f"variant-{index:02d}"
    done = out / "result.json"
    if done.is_file():  # a retried task: this variant finished in an earlier attempt
        ctx.console.print(f"  already trained: {done}")
        return VariantResult(**{"prompt_style": style, **json.loads(done.read_text())})
    run_id = find_or_start_run(
        ctx.experiment_id,
        {"flywheel.sweep_id": ctx.sweep_id, "flywheel.variant": str(index)},
        f"{ctx.sweep.name}-{index:02d}",
        ctx.parent_id,
    )
    steps = steps_for(cfg, len(train))  # the schedule both backends resolve from the training set's size
    with mlflow.start_run(run_id=run_id, nested=True):
        mlflow.log_params({**_flat_params(cfg), "prompt_style": style})
        mlflow.log_params(
            {"resolved_steps": steps, "resolved_epochs": round(epochs_seen(steps, cfg.batch_size, len(train)), 4)}
        )
        mlflow.set_tags(
            {
                "flywheel.backend": ctx.sweep.backend,
                "flywheel.hardware": hardware(),
                "flywheel.base_model": cfg.base_model,
                "flywheel.prompt_style": style,
            }
        )
        on_step = _step_logger(run_id)
        started = time.perf_counter()
        trained = train_variant(ctx.settings, ctx.sweep, cfg, train, out, on_step, ctx.console)
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
            metrics.update(validation_metrics(ctx.settings, cfg.base_model, trained.adapter_dir, val, ctx.budget))
            mlflow.log_artifacts(trained.adapter_dir, "adapter")
        mlflow.log_metrics(metrics)
        mlflow.set_tag("flywheel.status", trained.status)
    result = VariantResult(index, run_id, _flat_params(cfg), trained.status, trained.adapter_dir, metrics, style)
    write_text(str(done), json.dumps(asdict(result), indent=2))  # atomic: a retry never reads half of it
    ctx.console.print(
        f"  {trained.status}: loss {trained.final_loss:.3f}, {trained.tokens_per_s:.0f} tokens/s, "
        + ", ".join(f"{k} {v:.2f}" for k, v in metrics.items() if k.startswith("val_"))
    )
    return result


def _step_logger(run_id: str) -> Any:
    """An `on_step` callback that logs each step's training loss and learning rate to the run `run_id`."""
    import mlflow

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

    return on_step


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

    cfg = cfg.model_copy(update={"precision": settings.train.precision})
    return train_lora(train, cfg, out, lambda name: load_base(name, settings), on_step)
