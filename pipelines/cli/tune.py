"""`flywheel tune`: tuning after SFT from the signals the platform collected (issue 51)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.common import JsonOpt, UserError, cli_settings, console
from pipelines.cli.common import emit as _emit

WINDOW_TAG = "flywheel.training_window"  # registry.models: the window a version trained on

tune_app = typer.Typer(
    help="Tuning after SFT: DPO from the preference pairs (`flywheel labels pairs`), KTO from the thumbs "
    "(`flywheel labels thumbs`), GRPO with the scorer's reward.",
    no_args_is_help=True,
)


def _version(settings: Any, version: str, method: str) -> tuple[str, str, dict[str, str]]:
    """The version number, its base model and its tags (`run_id` added: the run that trained it), or one error
    line."""
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import alias_version

    number = version if version.isdigit() else alias_version(settings, version)
    if number is None:
        raise UserError(f"--version: no version or alias {version!r} in {settings.mlflow.registered_model}")
    import mlflow

    try:
        found = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, number)
        tags = {**found.tags, "run_id": found.run_id or ""}
    except mlflow.exceptions.MlflowException:
        raise UserError(f"--version: no version {number} in {settings.mlflow.registered_model}") from None
    base_model = tags.get("flywheel.base_model")
    if not base_model:
        raise UserError(
            f"--version: v{number} records no base model (tag flywheel.base_model): {method} cannot load it"
        )
    return number, base_model, tags


def _say(line: str) -> None:
    console.print(line, markup=False, highlight=False)  # stderr: stdout carries only the result


def _tuned_report(
    settings: Any, result: dict[str, Any], number: str, base_model: str, method: str, style: Any, parent: str
) -> dict[str, Any]:
    """A tune command's result, logged as an MLflow run under the version's training run (`parent`), with the
    version it started from and the `flywheel eval` line comparing them."""
    from pipelines.errors import one_line
    from pipelines.tune.stage import log_command_run

    tracking_error = None
    try:
        run_id = log_command_run(
            settings, result, version=number, base_model=base_model, style=str(style), parent_run_id=parent or None
        )
    except Exception as exc:  # noqa: BLE001 (the adapter is trained and written: its result is still printed)
        run_id, tracking_error = None, one_line(exc)  # one line, URI passwords masked
        console.print(
            f"warning: {method}: the adapter is in {result['adapter_dir']}, but its MLflow run could not be logged "
            f"({tracking_error}); showback will not price it",
            markup=False, highlight=False,
        )  # fmt: skip
    return {
        **result,
        "run_id": run_id,
        **({"tracking_error": tracking_error} if tracking_error else {}),
        "from_version": number,
        "base_model": base_model,
        "evaluate_with": f"flywheel eval --base-model {base_model} --version {number} "
        f"--adapter {method}={result['adapter_dir']}",
    }


def _config(cls: Any, defaults: Any, overrides: dict[str, Any]) -> Any:
    """The method's settings (`tune.<method>`) with the options given, or one error line naming the option."""
    from pydantic import ValidationError

    try:
        return cls(**{**defaults.model_dump(), **{k: v for k, v in overrides.items() if v is not None}})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None


def _local_runs(settings: Any, out: Path | None, method: str, number: str) -> Path:
    from pipelines.storage import is_local

    if out is None and not is_local(settings.zone("runs")):
        raise UserError(f"--out: the runs zone is not on this machine; name a local folder for the {method} run")
    return out or Path(settings.zone("runs").removeprefix("file://")) / "tune" / f"{method}-v{number}"


@tune_app.command("dpo")
def tune_dpo(
    version: Annotated[str, typer.Option(help="The registered version (number or alias) DPO starts from")] = "champion",
    out: Annotated[Path | None, typer.Option(help="Folder for the DPO run; default <runs>/tune/dpo-v<N>")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps (DpoConfig.max_steps)")] = None,
    beta: Annotated[float | None, typer.Option(help="Pull towards the SFT reference (DpoConfig.beta)")] = None,
    min_pairs: Annotated[int | None, typer.Option(min=1, help="Fewer training pairs: skipped, saying so")] = None,
    max_length: Annotated[
        int | None, typer.Option(min=32, help="Prompt and answer tokens; a longer pair is left out and counted")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """DPO on top of a registered version's SFT adapter, that adapter frozen as the reference, on the training
    split of the preference pairs; the result tells the `flywheel eval` command that compares it with that version."""
    from pipelines.base_models import load_base
    from pipelines.registry.models import adapter_path, prompt_style
    from pipelines.tune.dpo import DpoConfig
    from pipelines.tune.stage import run_dpo

    settings = cli_settings()
    overrides: dict[str, Any] = {"max_steps": steps, "beta": beta, "min_pairs": min_pairs, "max_length": max_length}
    cfg = _config(DpoConfig, settings.tune.dpo, overrides)
    number, base_model, tags = _version(settings, version, "DPO")
    folder = _local_runs(settings, out, "dpo", number)
    style = prompt_style(settings, number)
    result = run_dpo(
        settings, cfg, Path(adapter_path(settings, number)), folder, lambda: load_base(base_model, settings),
        style=style, floor_option="--min-pairs", progress=_say,
    )  # fmt: skip
    _emit_tuned(settings, result, number, base_model, style, tags["run_id"], as_json)


def _emit_tuned(
    settings: Any, result: dict[str, Any], number: str, base_model: str, style: Any, parent: str, as_json: bool
) -> None:
    """A DPO or KTO command's output: the tuned report, or the one line saying why it skipped with the counts
    that explain it."""
    method = result["method"]
    if result.get("skipped"):
        counts = result["pairs_summary" if method == "dpo" else "thumbs_summary"]
        if as_json:
            _emit({"skipped": result["skipped"], **counts}, True, "")
        else:
            console.print(result["skipped"], markup=False)
            _emit(counts, False, "preference pairs" if method == "dpo" else "rated answers")
        return
    _emit(_tuned_report(settings, result, number, base_model, method, style, parent), as_json, method)


@tune_app.command("kto")
def tune_kto(
    version: Annotated[str, typer.Option(help="The registered version (number or alias) KTO starts from")] = "champion",
    out: Annotated[Path | None, typer.Option(help="Folder for the KTO run; default <runs>/tune/kto-v<N>")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps (tune.kto.max_steps)")] = None,
    beta: Annotated[float | None, typer.Option(help="Pull towards the SFT reference (tune.kto.beta)")] = None,
    min_rows: Annotated[
        int | None, typer.Option(min=1, help="Fewer rated training answers (or no thumbs down): skipped, saying so")
    ] = None,
    max_length: Annotated[
        int | None, typer.Option(min=32, help="Prompt and answer tokens; a longer row is left out and counted")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """KTO on top of a registered version's SFT adapter, that adapter frozen as the reference, on the training
    split of the rated answers (thumbs up and corrections desirable, thumbs down undesirable; the rarer side
    weighted up); the result tells the `flywheel eval` command that compares it with that version."""
    from pipelines.base_models import load_base
    from pipelines.config.tune import KtoSettings
    from pipelines.registry.models import adapter_path, prompt_style
    from pipelines.tune.stage import run_kto

    settings = cli_settings()
    overrides: dict[str, Any] = {"max_steps": steps, "beta": beta, "min_rows": min_rows, "max_length": max_length}
    cfg = _config(KtoSettings, settings.tune.kto, overrides)
    number, base_model, tags = _version(settings, version, "KTO")
    folder = _local_runs(settings, out, "kto", number)
    style = prompt_style(settings, number)
    result = run_kto(
        settings, cfg, Path(adapter_path(settings, number)), folder, lambda: load_base(base_model, settings),
        style=style, floor_option="--min-rows", progress=_say,
    )  # fmt: skip
    _emit_tuned(settings, result, number, base_model, style, tags["run_id"], as_json)


@tune_app.command("grpo")
def tune_grpo(
    version: Annotated[str, typer.Option(help="The registered version (number or alias) GRPO starts")] = "champion",
    out: Annotated[Path | None, typer.Option(help="Folder for the GRPO run; default <runs>/tune/grpo-v<N>")] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps (tune.grpo.max_steps)")] = None,
    group_size: Annotated[int | None, typer.Option(min=2, help="Sampled answers per prompt")] = None,
    kl_beta: Annotated[float | None, typer.Option(min=0, help="KL coefficient against the SFT adapter")] = None,
    max_prompts: Annotated[int | None, typer.Option(min=1, help="Prompts drawn from the SFT train split")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(min=4, help="Answer budget; default as served")] = None,
    as_json: JsonOpt = False,
) -> None:
    """GRPO on top of a registered version's SFT adapter: answers sampled for the SFT training prompts under the
    served grammar, rewarded by the evaluation's scorer (a wrong write costs more than any gain), the SFT adapter
    the KL reference; the result tells the `flywheel eval` command that compares it with that version."""
    from pipelines.base_models import load_base
    from pipelines.config.tune import GrpoSettings
    from pipelines.tune.stage import run_grpo

    settings = cli_settings()
    overrides: dict[str, Any] = {
        "max_steps": steps, "group_size": group_size, "kl_beta": kl_beta, "max_prompts": max_prompts,
        "max_new_tokens": max_new_tokens,
    }  # fmt: skip
    cfg = _config(GrpoSettings, settings.tune.grpo, overrides)
    number, base_model, tags = _version(settings, version, "GRPO")
    folder = _local_runs(settings, out, "grpo", number)
    from pipelines.registry.models import adapter_path, answer_budget, prompt_style

    style = prompt_style(settings, number)
    window = tags.get(WINDOW_TAG) or None  # the window the version trained on
    console.print(f"grpo: v{number} ({base_model}), {cfg.max_steps} steps, groups of {cfg.group_size} ...")
    result = run_grpo(
        settings, cfg, Path(adapter_path(settings, number)), folder, lambda: load_base(base_model, settings),
        style=style, recorded_budget=answer_budget(settings, number), window=window,
        progress=_say,
    )  # fmt: skip
    _emit(_tuned_report(settings, result, number, base_model, "grpo", style, tags["run_id"]), as_json, "grpo")


@tune_app.command("export")
def tune_export(
    method: Annotated[str, typer.Option(help="dpo or grpo: the records NeMo RL trains on")],
    version: Annotated[str, typer.Option(help="The registered version (number or alias) it starts from")] = "champion",
    out: Annotated[
        str | None, typer.Option(help="Folder or s3:// prefix; default <runs>/tune/export/<method>-v<N>")
    ] = None,
    gpus: Annotated[int, typer.Option(min=1, max=8, help="GPUs of the pod plan (one node)")] = 8,
    max_prompts: Annotated[int | None, typer.Option(min=1, help="GRPO: prompts drawn (tune.grpo.max_prompts)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The tune stage's records in NVIDIA NeMo RL's formats (DPO: prompt / chosen_response / rejected_response;
    GRPO: prompts with the scorer's reward as the environment), its config overrides and the pod that runs them
    on the GPU pool (`pod.yaml`: `kubectl apply -f`)."""
    import yaml

    from pipelines.cluster.training import nemo_rl_pod
    from pipelines.registry.models import answer_budget, prompt_style
    from pipelines.storage import write_bytes
    from pipelines.tune.nemo_rl import export

    if method not in ("dpo", "grpo"):
        why = " (NeMo RL has no KTO: `flywheel tune kto` trains it here)" if method == "kto" else ""
        raise UserError(f"--method: expected dpo or grpo, got {method!r}{why}")
    settings = cli_settings()
    number, base_model, tags = _version(settings, version, method.upper())
    folder = out or f"{settings.zone('runs').rstrip('/')}/tune/export/{method}-v{number}"
    sft = f"models:/{settings.mlflow.registered_model}/{number}"
    plan = export(
        settings, method, folder, base_model=base_model, style=prompt_style(settings, number), sft_adapter=sft,
        recorded_budget=answer_budget(settings, number), max_prompts=max_prompts,
        window=tags.get(WINDOW_TAG) or None,
    )  # fmt: skip
    pod = nemo_rl_pod(settings, method=method, export_uri=folder, run_name=f"v{number}", gpus=gpus)
    write_bytes(f"{folder.rstrip('/')}/pod.yaml", yaml.safe_dump(pod, sort_keys=False).encode())
    _emit({**plan, "folder": folder, "pod": f"{folder.rstrip('/')}/pod.yaml"}, as_json, f"tune export ({method})")
