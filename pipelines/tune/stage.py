"""The `tune` stage (issue 51): after the SFT sweep, the project's method trains the sweep's best adapter further
before it is evaluated, registered and gated like any candidate.

- `off`: the SFT adapter goes on as it is.
- `dpo`: the preference pairs' training split (`prep.pairs`); fewer than `tune.dpo.min_pairs`: skipped with one
  line saying how many it has and needs, and the SFT adapter goes on.
- `kto`: the rated answers' training split (`prep.thumbs`: thumbs up and corrections desirable, thumbs down
  undesirable); fewer than `tune.kto.min_rows`, or no thumbs down: skipped the same way.
- `grpo`: the SFT training prompts, answers sampled under the served grammar and rewarded by the scorer.

The run is an MLflow child run of the sweep's parent run (tags `flywheel.kind` tune, `flywheel.tune_method`), its
adapter and `result.json` in `<runs>/tune/<sweep_id>-<method>/`: a retried task returns the finished result.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config.tune import DpoSettings, GrpoSettings, KtoSettings, TuneMethod
from pipelines.errors import DataProblem
from pipelines.toolcall.examples import PROMPT_STYLE_FILE
from pipelines.tune.reward import RewardError

if TYPE_CHECKING:
    from pipelines.config import Settings

Progress = Callable[[str], None]
TUNE_KIND = "tune"


def tune_bf16(settings: Settings) -> bool:
    """Whether the tune methods compute in bf16: on a GPU where it has bf16 (as SFT trains there, whatever
    `train.precision` says), on the CPU as SFT does (`train.precision`, where the CPU has bf16 units:
    `hardware.bf16_usable`)."""
    import torch

    from pipelines.hardware import bf16_usable

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return settings.train.precision == "bf16" and bf16_usable("train.precision bf16", "tuning")


def answer_budget(settings: Settings, cfg: GrpoSettings, recorded: int | None) -> int:
    """GRPO's answer budget: its own setting, else as served (`triton.max_new_tokens`, else the version's)."""
    from pipelines.toolcall.budget import FALLBACK

    return cfg.max_new_tokens or settings.triton.max_new_tokens or recorded or FALLBACK


def grpo_prompts(
    settings: Settings, cfg: GrpoSettings, style: Any, window: str | None
) -> tuple[Any, list[Any], list[str], dict[str, str]]:
    """GRPO's prompts: the SFT train split of `window` (up to `max_prompts`, stratified by tool and source,
    seeded) as examples in `style`, each example's grammar tools (write ids grounded as served), the tools'
    effects."""
    from pipelines.logs.toolsets import tool_effects
    from pipelines.prep.dataset import load_split
    from pipelines.toolcall.examples import grounded_tools, to_examples

    frame = load_split(settings, "train", limit=cfg.max_prompts, seed=cfg.seed, sampling="stratified", window=window)
    examples = to_examples(frame, style)
    effects = tool_effects(settings.zone("raw"))
    return frame, examples, grounded_tools(examples, effects, settings.triton.grounded_ids), effects


def run_grpo(
    settings: Settings,
    cfg: GrpoSettings,
    sft_adapter: Path,
    folder: Path,
    load_base: Callable[[], tuple[Any, Any]],
    *,
    style: Any,
    recorded_budget: int | None,
    window: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """GRPO from `sft_adapter` into `folder` on the SFT train split's prompts (stratified by tool and source,
    seeded), decoded as served; returns the result with what it trained on (also `folder/result.json`)."""
    from collections import Counter

    from pipelines.storage import write_bytes, write_json
    from pipelines.toolcall.decode import require_grammars
    from pipelines.tune.grpo import train_grpo

    frame, examples, tools, effects = grpo_prompts(settings, cfg, style, window)
    constrained = settings.triton.constrained if cfg.constrained is None else cfg.constrained
    if constrained:
        require_grammars(set(tools), "grpo: sampling under the grammar", "set tune.grpo.constrained: false")
    budget = answer_budget(settings, cfg, recorded_budget)
    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    frame[["record_id", "session_id"]].assign(tool=[e.tool for e in examples]).to_parquet(buffer, index=False)
    write_bytes(str(folder / "prompts.parquet"), buffer.getvalue())  # what this run trained on
    result = train_grpo(
        examples, tools, cfg, sft_adapter, folder, load_base,
        max_new_tokens=budget, constrained=constrained, effects=effects, progress=progress, bf16=tune_bf16(settings),
    )  # fmt: skip
    write_bytes(str(Path(result.adapter_dir) / PROMPT_STYLE_FILE), str(style).encode())  # `flywheel eval --adapter`
    by_tool = dict(Counter(e.tool for e in examples))
    report = {
        **result.to_dict(),
        "method": "grpo",
        "settings": cfg.model_dump(),
        "max_new_tokens": budget,
        "prompt_style": str(style),
        "prompts_by_tool": by_tool,
        "prompts_file": str(folder / "prompts.parquet"),
    }
    write_json(str(folder / "result.json"), report)
    return report


def run_dpo(
    settings: Settings, cfg: DpoSettings, sft_adapter: Path, folder: Path, load_base: Callable[[], tuple[Any, Any]],
    *, style: Any, floor_option: str = "tune.dpo.min_pairs", progress: Progress | None = None,
) -> dict[str, Any]:  # fmt: skip
    """DPO from `sft_adapter` into `folder` on the preference pairs' training split; too few pairs: a result with
    only the `skipped` line (naming `floor_option`) and the counts. The pairs it read (every split, `trained`
    marking the training split) and their counts are kept beside the adapter."""
    from pipelines.prep.pairs import collect_pairs, pair_summary
    from pipelines.tune.dpo import preference_rows, too_few, train_dpo

    pairs, dropped, quarantined = collect_pairs(settings)
    train = pairs[pairs["split"] == "train"]
    summary = pair_summary(pairs, dropped, quarantined)
    skipped = too_few(len(train), cfg, floor_option)
    if skipped:
        return {"method": "dpo", "skipped": skipped, "pairs_summary": summary}
    _keep(folder, "pairs", pairs, {**summary, "quarantined_pairs": quarantined})
    if progress is not None:
        progress(f"dpo: {len(train)} training pairs, {cfg.max_steps} steps ...")
    result = train_dpo(
        preference_rows(train, style), cfg, sft_adapter, folder, load_base, progress=progress, bf16=tune_bf16(settings)
    )
    return _finish(folder, result, "dpo", cfg, style, "pairs", summary)


def _keep(folder: Path, name: str, rows: Any, summary: dict[str, Any]) -> None:
    """What a preference run read, beside its adapter: `<name>.parquet` (every split, `trained` marking the
    training split) and `<name>_summary.json` (its counts)."""
    from pipelines.storage import write_bytes, write_json

    folder.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    rows.assign(trained=rows["split"] == "train").to_parquet(buffer, index=False)
    write_bytes(str(folder / f"{name}.parquet"), buffer.getvalue())
    write_json(str(folder / f"{name}_summary.json"), summary)


def _finish(
    folder: Path, result: Any, method: str, cfg: Any, style: Any, name: str, summary: dict[str, Any]
) -> dict[str, Any]:
    """A preference run's report (`folder/result.json`): the trainer's result, the method's settings and prompt
    style, and the counts of the `name` rows it read; the prompt style also beside the adapter, so it serves and
    evaluates as its SFT version does."""
    from pipelines.storage import write_bytes, write_json

    write_bytes(str(Path(result.adapter_dir) / PROMPT_STYLE_FILE), str(style).encode())
    report = {
        **result.to_dict(), "method": method, "settings": cfg.model_dump(), "prompt_style": str(style),
        f"{name}_summary": summary, f"{name}_file": str(folder / f"{name}.parquet"),
    }  # fmt: skip
    write_json(str(folder / "result.json"), report)
    return report


def run_kto(
    settings: Settings, cfg: KtoSettings, sft_adapter: Path, folder: Path, load_base: Callable[[], tuple[Any, Any]],
    *, style: Any, floor_option: str = "tune.kto.min_rows", progress: Progress | None = None,
) -> dict[str, Any]:  # fmt: skip
    """KTO from `sft_adapter` into `folder` on the rated answers' training split; too few (or no thumbs down): a
    result with only the `skipped` line (naming `floor_option`) and the counts. The rows it read (every split,
    `trained` marking the training split) and their counts are kept beside the adapter."""
    from pipelines.prep.thumbs import collect_thumbs, thumb_summary
    from pipelines.tune.kto import thumb_rows, too_few, train_kto

    thumbs, dropped, quarantined = collect_thumbs(settings)
    train = thumbs[thumbs["split"] == "train"]
    summary = thumb_summary(thumbs, dropped, quarantined)
    skipped = too_few(summary["train_desirable"], summary["train_undesirable"], cfg, floor_option)
    if skipped:
        return {"method": "kto", "skipped": skipped, "thumbs_summary": summary}
    _keep(folder, "thumbs", thumbs, {**summary, "quarantined_thumbs": quarantined})
    if progress is not None:
        progress(f"kto: {len(train)} rated training answers, {cfg.max_steps} steps ...")
    result = train_kto(
        thumb_rows(train, style), cfg, sft_adapter, folder, load_base, progress=progress, bf16=tune_bf16(settings)
    )
    return _finish(folder, result, "kto", cfg, style, "thumbs", summary)


def _log_run(run_id: str, report: dict[str, Any], sweep: dict[str, Any]) -> None:
    """The tune run's params, per-step curves, cost and tags on its MLflow child run."""
    import torch

    import mlflow

    with mlflow.start_run(run_id=run_id, nested=True):
        mlflow.log_params({f"tune.{k}": v for k, v in (report.get("settings") or {}).items()})
        mlflow.set_tags(
            {"flywheel.base_model": sweep["base_model"], "flywheel.prompt_style": sweep["prompt_style"],
             "flywheel.tune_method": report["method"], "flywheel.hardware": _one_device(torch)}
        )  # fmt: skip
        for name in ("losses", "rewards", "wrong_writes", "valid", "reward_margins"):
            for step, value in enumerate(report.get(name) or [], start=1):
                mlflow.log_metric(f"tune_{name}", value, step=step)
        mlflow.log_metrics(
            {
                "tune_seconds": float(report["seconds"]),
                "tune_tokens": float(report["tokens"]),
                "tune_steps": float(report["steps"]),
                "tune_examples": float(report.get("prompts") or report.get("pairs") or report.get("rows") or 0),
            }
        )
        mlflow.log_dict(report, "tune/result.json")


def log_command_run(
    settings: Settings, report: dict[str, Any], *, version: str, base_model: str, style: str, parent_run_id: str | None
) -> str:
    """A `flywheel tune` command's run: an MLflow run under the version's own training run, logged as the DAG's
    tune run is (params, per-step curves, seconds and tokens, the device), so showback prices it too."""
    from mlflow import MlflowClient
    from pipelines.clients.mlflow import use_tracking

    tags = {
        "flywheel.kind": TUNE_KIND, "flywheel.tune_method": report["method"], "flywheel.tune_from_version": version,
        **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {}),
    }  # fmt: skip
    experiment_id = use_tracking(settings)  # points the client below at the project's tracking store
    client = MlflowClient()
    run_id = client.create_run(
        experiment_id, tags=tags, run_name=f"tune {report['method']} from v{version}"
    ).info.run_id
    try:
        _log_run(run_id, report, {"base_model": base_model, "prompt_style": style})
    except BaseException:
        client.set_terminated(run_id, "FAILED")  # never a run left RUNNING
        raise
    return run_id


def _one_device(torch: Any) -> str:
    """The device the run trained on (TRL trains in this process, on one device): showback prices it."""
    from pipelines.train.sweep_results import hardware

    return f"1x {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else hardware()


def summary(report: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    """What the registry, the model card and showback carry of a tune run."""
    keys = (
        "method", "skipped", "prompts", "pairs", "rows", "desirable", "undesirable", "steps", "seconds", "tokens",
        "too_long", "prompts_by_tool",
    )  # fmt: skip
    found = {k: report[k] for k in keys if k in report}
    if "pairs_summary" in report:
        found["pairs_by_source"] = (report["pairs_summary"] or {}).get("by_source")
    if "thumbs_summary" in report:
        found["thumbs_by_source"] = (report["thumbs_summary"] or {}).get("by_source")
    if report.get("rewards"):
        found["reward_first"], found["reward_last"] = report["rewards"][0], report["rewards"][-1]
    return {**found, **({"run_id": run_id, "adapter_dir": report["adapter_dir"]} if run_id else {})}


def _skipped(trained: dict[str, Any], method: str, why: str, progress: Progress | None) -> dict[str, Any]:
    line = f"{method}: skipped: {why}"
    if progress is not None:
        progress(line)
    return {**trained, "tune": {"method": method, "skipped": line}}


def tune_stage(
    settings: Settings, trained: dict[str, Any], method: TuneMethod, progress: Progress | None = None
) -> dict[str, Any]:
    """The sweep's result (`tasks.train`) with its adapter tuned by `method`: `adapter_dir` and `best_run_id` name
    the tuned adapter and its run, `sft_adapter_dir` and `sft_run_id` the SFT one, `tune` what the run did."""
    from pipelines.base_models import load_base
    from pipelines.clients.mlflow import use_tracking
    from pipelines.storage import is_local, read_json
    from pipelines.train.sweep import find_or_start_run

    if method == "off":
        return {**trained, "tune": {"method": "off"}}
    if not is_local(settings.zone("runs")):  # the SFT adapter goes on; the cluster path is `flywheel tune export`
        why = (
            "the runs zone is not on this machine: tuning in the DAG runs where the sweep's adapter is; "
            "on a cluster, `flywheel tune export` plans DPO or GRPO for NeMo RL (KTO trains where the runs zone is)"
        )
        return _skipped(trained, method, why, progress)
    sweep = read_json(trained["sweep_uri"])
    folder = Path(settings.zone("runs").removeprefix("file://")) / "tune" / f"{sweep['sweep_id']}-{method}"
    done = folder / "result.json"
    sft = Path(trained["adapter_dir"])
    if done.is_file() and Path(json.loads(done.read_text())["adapter_dir"]).is_dir():
        report = json.loads(done.read_text())  # a retried task: this method finished in an earlier attempt
    else:
        base = lambda: load_base(sweep["base_model"], settings)  # noqa: E731
        style = sweep["prompt_style"]
        try:
            if method == "grpo":
                report = run_grpo(
                    settings, settings.tune.grpo, sft, folder, base, style=style,
                    recorded_budget=sweep.get("answer_budget"), window=sweep.get("window"), progress=progress,
                )  # fmt: skip
            elif method == "kto":
                report = run_kto(settings, settings.tune.kto, sft, folder, base, style=style, progress=progress)
            else:
                report = run_dpo(settings, settings.tune.dpo, sft, folder, base, style=style, progress=progress)
        except RewardError:
            raise  # a reward that fails is never skipped: the task fails, naming the prompt
        except DataProblem as exc:  # nothing this method can train on: the SFT adapter goes on, saying why
            return _skipped(trained, method, str(exc), progress)
    if report.get("skipped"):
        if progress is not None:
            progress(report["skipped"])
        return {**trained, "tune": summary(report, None)}
    experiment_id = use_tracking(settings)
    run_id = find_or_start_run(
        experiment_id,
        {"flywheel.sweep_id": sweep["sweep_id"], "flywheel.kind": TUNE_KIND, "flywheel.tune_method": method},
        f"tune {method} {sweep['sweep_id']}",
        sweep["parent_run_id"],
    )
    from mlflow import MlflowClient

    if "tune_seconds" not in MlflowClient().get_run(run_id).data.metrics:  # not logged yet (a retry may find it so)
        _log_run(run_id, report, sweep)
    return {
        **trained,
        "adapter_dir": report["adapter_dir"],
        "best_run_id": run_id,
        "sft_adapter_dir": str(sft),
        "sft_run_id": trained["best_run_id"],
        "tune": summary(report, run_id),
    }
