"""`flywheel tune`: tuning after SFT from the signals the platform collected (issue 51)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.common import JsonOpt, UserError, cli_settings, console
from pipelines.cli.common import emit as _emit

tune_app = typer.Typer(
    help="Tuning after SFT: DPO from the preference pairs (`flywheel labels pairs`).", no_args_is_help=True
)


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
    from pydantic import ValidationError

    from pipelines.base_models import load_base
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import adapter_path, alias_version, prompt_style
    from pipelines.storage import is_local, write_bytes, write_json
    from pipelines.toolcall.examples import PROMPT_STYLE_FILE
    from pipelines.tune.dpo import DpoConfig, preference_rows, too_few, train_dpo
    from pipelines.tune.pairs import collect_pairs, pair_summary

    settings = cli_settings()
    number = version if version.isdigit() else alias_version(settings, version)
    if number is None:
        raise UserError(f"--version: no version or alias {version!r} in {settings.mlflow.registered_model}")
    overrides: dict[str, Any] = {"max_steps": steps, "beta": beta, "min_pairs": min_pairs, "max_length": max_length}
    try:
        cfg = DpoConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None
    if out is None and not is_local(settings.zone("runs")):
        raise UserError("--out: the runs zone is not on this machine; name a local folder for the DPO run")
    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, number).tags
    base_model = tags.get("flywheel.base_model")
    if not base_model:
        raise UserError(f"--version: v{number} records no base model (tag flywheel.base_model): DPO cannot load it")
    pairs, dropped, quarantined = collect_pairs(settings)
    train = pairs[pairs["split"] == "train"]
    summary = pair_summary(pairs, dropped, quarantined)
    skipped = too_few(len(train), cfg)
    if skipped:  # one line, and the counts that explain it
        if as_json:
            _emit({"skipped": skipped, **summary}, True, "")
        else:
            console.print(skipped, markup=False)
            _emit(summary, False, "preference pairs")
        return
    style = prompt_style(settings, number)
    rows = preference_rows(train, style)
    folder = out or Path(settings.zone("runs").removeprefix("file://")) / "tune" / f"dpo-v{number}"
    folder.mkdir(parents=True, exist_ok=True)  # what this run trained on, kept beside its adapter
    buffer = io.BytesIO()
    pairs.assign(trained=pairs["split"] == "train").to_parquet(buffer, index=False)  # every split; `trained` says
    write_bytes(str(folder / "pairs.parquet"), buffer.getvalue())
    write_json(str(folder / "pairs_summary.json"), {**summary, "quarantined_pairs": quarantined})
    console.print(f"dpo: {len(rows)} training pairs on v{number} ({base_model}), {cfg.max_steps} steps ...")
    result = train_dpo(
        rows, cfg, Path(adapter_path(settings, number)), folder, lambda: load_base(base_model, settings),
        progress=lambda line: console.print(line, markup=False, highlight=False),
    )  # fmt: skip
    write_bytes(str(Path(result.adapter_dir) / PROMPT_STYLE_FILE), style.encode())  # `flywheel eval --adapter`
    report: dict[str, Any] = {
        **result.to_dict(),
        "from_version": number,
        "base_model": base_model,
        "settings": cfg.model_dump(),
        "pairs_summary": summary,
        "pairs_file": str(folder / "pairs.parquet"),
        "prompt_style": style,
        "evaluate_with": f"flywheel eval --base-model {base_model} --version {number} "
        f"--adapter dpo={result.adapter_dir}",
    }
    _emit(report, as_json, "dpo")
