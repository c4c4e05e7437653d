"""Train, evaluate and browse the adapter registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer
from rich.table import Table

from pipelines.cli.common import JsonOpt, UserError, cli_settings, console, stdout_console
from pipelines.cli.common import emit as _emit
from pipelines.config import decoding_modes

if TYPE_CHECKING:
    from pipelines.config.stages import Decoding

app = typer.Typer()  # this module's top-level commands (merged into `flywheel`)


registry_app = typer.Typer(help="Browse and move the adapter registry's aliases (MLflow).", no_args_is_help=True)


@app.command("train")
def train_cmd(
    sweep: Annotated[str | None, typer.Option(help="Sweep file (YAML); default: train.sweep in the config.")] = None,
    backend: Annotated[str | None, typer.Option(help="hf or nemo: override the sweep file's backend.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a LoRA sweep on the latest training set: one MLflow child run per variant, best one picked."""
    from pipelines.train.sweep import run_sweep
    from pipelines.train.sweep_config import load_sweep

    settings = cli_settings()
    if backend not in (None, "hf", "nemo"):
        raise UserError(f"--backend: expected hf or nemo, got {backend!r}")
    result = run_sweep(settings, load_sweep(sweep or settings.train.sweep, backend or settings.train.backend), console)
    rows = {
        f"variant {v.index}": f"{v.status}; "
        + ", ".join(
            f"{k}={x:.3g}" for k, x in v.metrics.items() if k.startswith("val_") or k in ("final_loss", "tokens_per_s")
        )
        for v in result.variants
    }
    _emit(
        {
            "sweep": result.sweep_id,
            "parent run": result.parent_run_id,
            **rows,
            "best": result.best,
            "result": result.uri,
        }
        if not as_json
        else result.to_dict(),
        as_json,
        "sweep",
    )


KEEP_HELP = (
    "--episodes: write the tuned conditions' successful episodes to the raw zone as training data "
    "(label_source verified; the label policy decides whether they train)."
)


VIA_HELP = (
    "--episodes: process (the models in this process) or triton (the loaded Triton models answer, as served; "
    "greedy only: no sampled tries or gold-call probabilities)."
)


@app.command("eval")
def eval_cmd(
    adapter: Annotated[
        list[str] | None, typer.Option(help="Adapter folder(s) to evaluate (label=path or path).")
    ] = None,
    version: Annotated[
        list[str] | None, typer.Option(help="Registered version(s) or alias(es), e.g. champion.")
    ] = None,
    logs: Annotated[
        str | None, typer.Option(help="Evaluate on this log file (our log format) instead of a split.")
    ] = None,
    split: Annotated[str, typer.Option(help="train, val or test")] = "test",
    examples: Annotated[
        int | None,
        typer.Option(min=1, help="Requests (a seeded sample stratified by tool; default: evaluation.first_examples)."),
    ] = None,
    base_model: Annotated[
        str, typer.Option(help="Base model of the adapters (catalogue name or path).")
    ] = "smollm2-135m-instruct",
    shots: Annotated[int | None, typer.Option(min=0, help="In-context examples for the few-shot baseline.")] = None,
    baselines: Annotated[bool, typer.Option(help="Include base zero-shot and few-shot.")] = True,
    constrained: Annotated[
        str | None,
        typer.Option(
            help="served, off, on or both: decode under the offered tools' grammar (default: evaluation.constrained)"
        ),
    ] = None,
    name: Annotated[str, typer.Option(help="Report folder name under reports/evaluation/.")] = "manual",
    grounded_ids: Annotated[
        bool | None,
        typer.Option(help="Under the grammar, write ids only from the conversation (default: triton.grounded_ids)"),
    ] = None,
    episodes: Annotated[
        Path | None,
        typer.Option(help="Judge whole conversations on these tasks (tau-bench task lines) against the environment."),
    ] = None,
    db: Annotated[Path | None, typer.Option(help="--episodes: the environment's database (episodes.db).")] = None,
    tools: Annotated[Path | None, typer.Option(help="--episodes: the tools file offered (episodes.tools).")] = None,
    shot_tasks: Annotated[
        Path | None, typer.Option(help="--episodes: tasks whose gold trajectories are the few-shot examples.")
    ] = None,
    tries: Annotated[bool, typer.Option(help="--episodes: k sampled tries per task for pass^k.")] = True,
    teacher_forced: Annotated[bool, typer.Option(help="--episodes: the teacher-forced steps.")] = True,
    keep_successes: Annotated[bool, typer.Option(help=KEEP_HELP)] = False,
    via: Annotated[str, typer.Option(help=VIA_HELP)] = "process",
    as_json: JsonOpt = False,
) -> None:
    """Evaluate base zero-shot, base few-shot and tuned adapters side by side (JSON + HTML report); with
    --episodes, whole conversations against the environment (teacher-forced and closed loop, pass^k)."""
    from pipelines.evaluate.pipeline import EvalConfig, evaluate
    from pipelines.toolcall.budget import FALLBACK

    settings = cli_settings()
    _check_via(via, episodes)
    if episodes is not None:
        files, flags = (episodes, db, tools, shot_tasks), (baselines, tries, teacher_forced, keep_successes, as_json)
        return _eval_episodes(settings, (adapter or [], version or []), base_model, shots, name, files, flags, via)
    if split not in ("train", "val", "test"):
        raise UserError(f"--split: expected train, val or test, got {split!r}")
    if constrained not in (None, "served", "off", "on", "both"):
        raise UserError(f"--constrained: expected served, off, on or both, got {constrained!r}")
    adapters, budgets = _adapters_to_evaluate(settings, adapter or [], version or [])
    cfg = EvalConfig(
        base_model=base_model,
        split=cast(Literal["train", "val", "test"], split),  # checked above
        logs=logs,
        baselines=baselines,
        examples=examples or settings.evaluation.first_examples,
        shots=settings.evaluation.shots if shots is None else shots,
        constrained=decoding_modes(
            cast("Decoding | None", constrained) or settings.evaluation.constrained,  # checked above
            settings.triton.constrained,
        ),
        grounded_ids=settings.triton.grounded_ids if grounded_ids is None else grounded_ids,
        # the versions' recorded answer budgets (the largest); an adapter folder has none
        max_new_tokens=settings.evaluation.max_new_tokens or max(budgets or [FALLBACK]),
    )
    report = evaluate(settings, cfg, adapters, name, console)
    if as_json:
        _emit(report.to_dict(), True, "")
        return
    _print_evaluation(report, logs)


def _eval_episodes(
    settings: Any,
    chosen: tuple[list[str], list[str]],
    base_model: str,
    shots: int | None,
    name: str,
    files: tuple[Path, Path | None, Path | None, Path | None],
    flags: tuple[bool, bool, bool, bool, bool],
    via: str = "process",
) -> None:
    """`flywheel eval --episodes`; `chosen`: the adapter folders and versions; `flags`: baselines, sampled tries,
    teacher-forced steps, keep successes, JSON; `via`: process, or triton (`bench.episodes`)."""
    from datetime import date

    from pipelines.evaluate.episode_run import EpisodeRun, gold_pool_from, policies_for, run_episodes, settings_db
    from pipelines.simulate.environments import load_environment
    from pipelines.toolcall.budget import FALLBACK

    tasks, db, tools, shot_tasks = files
    baselines, tries, teacher_forced, keep, as_json = flags
    adapters, budgets = _adapters_to_evaluate(settings, *chosen)
    budget = settings.evaluation.max_new_tokens or max(budgets or [FALLBACK])
    e = settings.episodes
    db = settings_db(settings, db)
    tools = tools or (Path(e.tools) if e.tools else None)
    if tools is None:
        raise UserError("--tools: the tools file the episodes offer (or set episodes.tools)")
    for what, path in (("--episodes", tasks), ("--db", db), ("--tools", tools), ("--shot-tasks", shot_tasks)):
        if path is not None and not path.is_file():
            raise UserError(f"{what}: no such file {path}")
    if keep:  # before any model is loaded: the gate's own tasks never become training data
        from pipelines.errors import DataProblem
        from pipelines.evaluate.episode_data import refuse_gate_tasks
        from pipelines.evaluate.episodes import load_tasks

        try:
            refuse_gate_tasks(settings, load_tasks(tasks)[0])
        except DataProblem as exc:
            raise UserError(f"--keep-successes: {str(exc).removeprefix('keep successes: ')}") from None
    effects = load_environment(e.environment, db).effects()
    pool = gold_pool_from(settings, shot_tasks or (Path(e.shot_tasks) if e.shot_tasks else None), db, tools, tasks)
    policies = policies_for(
        settings, base_model, adapters, tools, effects=effects, day=date.today().isoformat(), baselines=baselines,
        shots=settings.evaluation.shots if shots is None else shots, pool=pool, max_new_tokens=budget,
    )  # fmt: skip
    if via == "triton":
        from pipelines.bench.episodes import through_triton

        policies = through_triton(settings, policies, _served_versions(settings, chosen[1]))
    run = EpisodeRun(tasks, db, tools, name, teacher_forced=teacher_forced, sample_tries=tries,
                     keep_successes=settings.zone("raw") if keep else None)  # fmt: skip
    try:
        report = run_episodes(settings, run, policies, console)
    finally:
        for client in {id(c): c for c in (getattr(p, "client", None) for p in policies) if c is not None}.values():
            client.close()  # through Triton: the connections the conditions shared
    if as_json:
        _emit(report, True, "")
    else:
        _episodes_table(report, e.k)
    if (report.get("kept") or {}).get("error"):  # the report is written; the kept episodes are not
        raise UserError(f"--keep-successes: {report['kept']['error']}")
    if report.get("failed"):  # the report holds what finished
        label, why = next(iter(report["failed"].items()))
        raise UserError(f"episodes: {label} stopped: {why} (the report keeps what finished: {report.get('html_uri')})")


def _episodes_table(report: dict[str, Any], k: int) -> None:
    table = Table(
        "condition", "closed loop pass^1", f"pass^{k}", "teacher-forced steps", "wrong writes", "tokens/episode"
    )
    for row in report["conditions"].values():
        table.add_row(
            row["condition"],
            *(
                "n/a" if row.get(m) is None else f"{row[m]:.3f}"
                for m in ("closed_loop_pass^1", f"closed_loop_pass^{k}", "teacher_forced_step_exact")
            ),
            str(row["wrong_writes"]),
            "n/a" if row.get("prompt_tokens_per_episode") is None else f"{row['prompt_tokens_per_episode']:.0f}",
        )
    stdout_console().print(table)
    stdout_console().print(
        f"{report['scored']} of {report['tasks']} tasks scored, {len(report['skipped'])} skipped; "
        f"report: {report['html_uri']}"
    )
    if report.get("kept") and not report["kept"].get("error"):
        kept = report["kept"]
        stdout_console().print(
            f"kept {kept['trajectories']} successful trajectories ({kept['records']} steps, label_source verified): "
            f"{kept['file'] or 'nothing to write'}"
        )


def _check_via(via: str, episodes: Path | None) -> None:
    if via not in ("process", "triton") or (episodes is None and via != "process"):
        raise UserError(f"--via: process, or triton with --episodes (requests are evaluated in process), got {via!r}")


def _served_versions(settings: Any, refs: list[str]) -> dict[str, str | None]:
    """Condition label -> the registry version Triton serves it from (None: the base model), as
    `_adapters_to_evaluate` labels the conditions."""
    from pipelines.registry.models import alias_version

    out: dict[str, str | None] = {"base_zero_shot": None, "base_few_shot": None}
    for ref in refs:
        number = ref if ref.isdigit() else alias_version(settings, ref)
        if number is not None:  # an unknown ref is refused by `_adapters_to_evaluate`, never served by the base
            out["tuned_champion" if ref == "champion" else f"tuned_v{number}"] = str(number)
    return out


def _adapters_to_evaluate(settings: Any, folders: list[str], versions: list[str]) -> tuple[list[Any], list[int]]:
    """`--adapter` folders and `--version` refs as the evaluation's adapters, with the versions' answer budgets."""
    from pipelines.evaluate.pipeline import CONSTRAINED, Adapter, is_tuned_reference
    from pipelines.registry.models import adapter_path, alias_version, answer_budget, prompt_style
    from pipelines.toolcall.budget import FALLBACK
    from pipelines.toolcall.examples import PROMPT_STYLE_FILE

    adapters, budgets = [], []
    for item in folders:
        label, _, path = item.rpartition("=")
        if not Path(path, "adapter_config.json").is_file():
            raise UserError(f"--adapter: no adapter_config.json in {path}")
        style = Path(path, PROMPT_STYLE_FILE)  # written beside an adapter that knows its style (flywheel tune dpo)
        written = style.read_text().strip() if style.is_file() else "short"
        if written not in ("full", "short", "names"):
            raise UserError(f"--adapter: {style} names no prompt style: {written!r}")
        label = label or Path(path).parent.name  # a tuned condition, so the evaluation compares it
        name = label if label.startswith("tuned_") else f"tuned_{label}"
        if is_tuned_reference(name) and name.removesuffix(CONSTRAINED) != "tuned_sft":  # the registry's names
            raise UserError(f"--adapter {item}: the label {label!r} names a registered version; use --version")
        adapters.append(Adapter(name, path, cast("Any", written)))
    for ref in versions:
        number = ref if ref.isdigit() else alias_version(settings, ref)
        if number is None:
            raise UserError(f"--version: no version or alias {ref!r} in {settings.mlflow.registered_model}")
        # `--version champion` is compared as the champion, as the gate compares it
        label = "tuned_champion" if ref == "champion" else f"tuned_v{number}"
        adapters.append(Adapter(label, adapter_path(settings, number), prompt_style(settings, number)))
        budgets.append(answer_budget(settings, number) or FALLBACK)
    labels = [a.label for a in adapters]
    if twice := sorted({x for x in labels if labels.count(x) > 1}):
        raise UserError(f"--adapter/--version: two adapters would both be evaluated as {', '.join(twice)}")
    return adapters, budgets


def _print_evaluation(report: Any, logs: str | None) -> None:
    table = Table(title=f"evaluation on {report.examples} requests ({report.html_uri})")
    for column in ("condition", "exact_match", "name_accuracy", "arg_f1", "prompt_tokens_mean", "latency_ms_p50"):
        table.add_column(column)
    for row in report.table():
        table.add_row(
            *(
                f"{row[c]:.3f}" if isinstance(row[c], float) and c != "latency_ms_p50" else str(row[c])
                for c in ("condition", "exact_match", "name_accuracy", "arg_f1", "prompt_tokens_mean", "latency_ms_p50")
            )
        )
    out = stdout_console()
    out.print(table)
    from pipelines.evaluate.report import comparison_lines

    for line in comparison_lines(report.comparisons):
        out.print(line, markup=False, highlight=False)
    if logs:  # a split carries the context the features stage joined; a log file gets the served one
        out.print(f"customer context: {report.settings.get('customer_context')}", markup=False, highlight=False)


@registry_app.command("list")
def registry_list(as_json: JsonOpt = False) -> None:
    """Every registered version with its aliases, sweep and gate decision."""
    from pipelines.clients.mlflow import client

    settings = cli_settings()
    name = settings.mlflow.registered_model
    registry = client(settings)
    versions = registry.search_model_versions(f"name='{name}'")
    aliases: dict[str, list[str]] = {}  # search results carry no aliases; the registered model does
    if versions:
        for alias, number in sorted(registry.get_registered_model(name).aliases.items()):
            aliases.setdefault(str(number), []).append(alias)
    rows = [
        {
            "version": v.version,
            "aliases": aliases.get(str(v.version), []),
            "sweep": v.tags.get("flywheel.sweep_id"),
            "base_model": v.tags.get("flywheel.base_model"),
            "gate": v.tags.get("flywheel.gate", ""),
        }
        for v in sorted(versions, key=lambda v: int(v.version))
    ]
    _emit(
        {"versions": rows} if as_json else {f"v{r['version']}": r for r in rows},
        as_json,
        settings.mlflow.registered_model,
    )


@registry_app.command("history")
def registry_history(as_json: JsonOpt = False) -> None:
    """Champion changes: promotions and rollbacks, with their reasons."""
    from pipelines.registry.models import history

    entries = history(cli_settings())
    _emit(
        {"history": entries} if as_json else {f"{i}. {e.get('at', '')}": e for i, e in enumerate(entries, 1)},
        as_json,
        "champion history",
    )


@registry_app.command("rollback")
def registry_rollback(as_json: JsonOpt = False) -> None:
    """Point `champion` back at the version it replaced."""
    from pipelines.registry.models import RegistryError, rollback

    try:
        _emit(rollback(cli_settings()), as_json, "rollback")
    except RegistryError as exc:
        raise UserError(str(exc)) from None
