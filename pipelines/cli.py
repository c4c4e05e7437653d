"""`flywheel`: one entry point for every stage and the local servers.

Commands only parse arguments and call `pipelines` functions; errors a user can fix (bad config,
bad arguments, a busy port) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.exceptions import TyperException
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pipelines.cli_common import JsonOpt, UserError, console
from pipelines.cli_common import emit as _emit
from pipelines.cli_common import local_settings as _local_settings
from pipelines.cli_gateway import gateway_app
from pipelines.config import ConfigError, Settings, get_settings
from pipelines.errors import keep_traceback, one_line
from pipelines.security import mask_uri_passwords, redact_uri

app = typer.Typer(
    name="flywheel",
    help="Commerce Flywheel: keep a commerce agent's tool-calling model fast, cheap and good.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
logs_app = typer.Typer(help="Generate, check and describe commerce-agent logs.", no_args_is_help=True)
config_app = typer.Typer(help="Show the effective configuration.", no_args_is_help=True)
app.add_typer(logs_app, name="logs")
app.add_typer(config_app, name="config")

app.add_typer(gateway_app, name="gateway")


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), console=console, transient=True)


# ---- config ---------------------------------------------------------------------------------
@config_app.command("show")
def config_show(as_json: JsonOpt = False) -> None:
    """Print the effective settings (profile defaults + YAML + FLYWHEEL_* env); secrets are masked."""
    from pipelines.security import redact_settings

    data = redact_settings(get_settings().model_dump(mode="json"))
    if as_json:
        _emit(data, True, "")
    else:
        Console().print_json(json.dumps(data))


@app.command("scan-secrets")
def scan_secrets(as_json: JsonOpt = False) -> None:
    """Look for secrets in what the platform wrote: service and task logs, reports, MLflow params and
    tags. Finds the configured passwords and keys and credential shapes (URIs with passwords, AWS
    keys, private keys, bearer tokens); prints where, never the value. Exit 1 when anything is found."""
    from pipelines.security import scan_platform

    settings = get_settings()
    if not settings.is_local:
        raise UserError("scan-secrets reads the local root's logs; on a cluster scan the log store instead")
    findings = [str(f) for f in scan_platform(settings)]
    _emit({"findings": len(findings), "where": findings[:50]}, as_json, "secret scan")
    if findings:
        raise typer.Exit(1)


# ---- logs -----------------------------------------------------------------------------------
@logs_app.command("generate")
def logs_generate(
    records: Annotated[int, typer.Option(min=0, help="How many log records (agent turns) to write.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and options give byte-identical files.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Raw zone folder; default: the configured raw zone.")] = None,
    days: Annotated[int, typer.Option(min=1, help="Spread records over this many daily partitions.")] = 1,
    end_date: Annotated[str | None, typer.Option(help="Last partition date, YYYY-MM-DD (default: today, UTC).")] = None,
    drift: Annotated[str, typer.Option(help="Traffic shift: none, holiday, new-category, locale, tool-mix.")] = "none",
    drift_magnitude: Annotated[float, typer.Option(min=0.0, max=1.0, help="Strength of the drift, 0..1.")] = 0.6,
    bad_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of bad records (all kinds).")] = 0.05,
    gzip_output: Annotated[bool, typer.Option("--gzip", help="Write .jsonl.gz instead of .jsonl.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write realistic synthetic commerce-agent traffic into date partitions of the raw zone."""
    from pipelines.logs.generator import Drift, GeneratorConfig, write_raw_logs

    try:
        drift_kind = Drift(drift)
    except ValueError:
        raise UserError(f"--drift: expected one of {', '.join(d.value for d in Drift)}, got {drift!r}") from None
    config = GeneratorConfig(seed=seed, records=records, days=days, end_date=_parse_date(end_date, "--end-date"),
                             bad_share=bad_share, drift=drift_kind, drift_magnitude=drift_magnitude)
    raw_root = out or Path(get_settings().zone("raw"))
    with _progress() as progress:
        task = progress.add_task("generating logs", total=records)
        summary = write_raw_logs(config, raw_root, compress=gzip_output,
                                 progress=lambda n: progress.advance(task, n))
    _emit(summary.to_dict(), as_json, f"wrote {summary.records} records to {raw_root}")


@logs_app.command("check")
def logs_check(
    path: Annotated[Path | None, typer.Argument(help="Raw zone folder or one JSONL file; default: the raw zone.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Schema-check raw logs and count the reasons lines would be quarantined."""
    from pipelines.logs.raw import check_files, raw_files

    target = path or Path(get_settings().zone("raw"))
    if not target.exists():
        raise UserError(f"no such file or folder: {target}")
    files = [target] if target.is_file() else raw_files(target)
    if not files:
        raise UserError(f"no JSONL files under {target} (expected dt=YYYY-MM-DD/*.jsonl[.gz])")
    _emit(check_files(files).to_dict(), as_json, f"checked {len(files)} files")


@logs_app.command("import-webshop")
def logs_import_webshop(
    pairs_file: Annotated[Path, typer.Argument(help="WebShop instruction_to_query*.json")],
    day: Annotated[str, typer.Option("--date", help="Partition to write, YYYY-MM-DD.")],
    out: Annotated[Path | None, typer.Option(help="Raw zone folder; default: the configured raw zone.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn WebShop's human search queries into search_products turns in a raw partition."""
    from pipelines.logs.importers import webshop_to_raw

    if not pairs_file.is_file():
        raise UserError(f"no such file: {pairs_file}")
    result = webshop_to_raw(pairs_file, out or Path(get_settings().zone("raw")), _parse_date(day, "--date"))
    _emit(result, as_json, "WebShop import")


@logs_app.command("import-retail")
def logs_import_retail(
    tools_file: Annotated[Path, typer.Argument(help="tau-bench retail tools_openai_schema.json")],
    tasks_file: Annotated[Path, typer.Argument(help="tau-bench retail tasks_*.jsonl")],
    day: Annotated[str, typer.Option("--date", help="Partition to write, YYYY-MM-DD.")],
    out: Annotated[Path | None, typer.Option(help="Raw zone folder; default: the configured raw zone.")] = None,
    db: Annotated[Path | None, typer.Option(help="tau-bench's db.json: each touched order is looked up first "
                                            "(get_order_details with its real result); default: db.json beside "
                                            "the tools file when there is one")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn tau-bench retail tasks into turns under their own tool schemas (registered as a toolset)."""
    from pipelines.logs.importers import retail_to_raw

    db = db or (tools_file.parent / "db.json" if (tools_file.parent / "db.json").is_file() else None)
    for f in (tools_file, tasks_file, *([db] if db else [])):
        if not f.is_file():
            raise UserError(f"no such file: {f}")
    result = retail_to_raw(tools_file, tasks_file, out or Path(get_settings().zone("raw")),
                           _parse_date(day, "--date"), db_file=db)
    _emit(result, as_json, "retail import")


@logs_app.command("schema")
def logs_schema(write: Annotated[bool, typer.Option(help="Rewrite the committed JSON Schema file.")] = False) -> None:
    """Print the log record's JSON Schema (or rewrite the committed file with --write)."""
    from pipelines.logs.schema import json_schema, write_json_schema

    if write:
        console.print(f"wrote {write_json_schema()}")
    else:
        sys.stdout.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


# ---- data path ------------------------------------------------------------------------------
features_app = typer.Typer(help="Feast: compute, register and materialize features; look up context.",
                           no_args_is_help=True)
app.add_typer(features_app, name="features")
EndOpt = Annotated[str | None, typer.Option("--end-date", help="Last day of the window, YYYY-MM-DD (default: yesterday).")]
DaysOpt = Annotated[int, typer.Option("--window-days", min=1, help="Days in the window, ending at --end-date.")]


def _window_arg(end_date: str | None, window_days: int) -> dict[str, str]:
    from pipelines.tasks import resolve_window

    if end_date:
        _parse_date(end_date, "--end-date")
    return resolve_window({"end_date": end_date, "window_days": window_days})


@app.command("prep")
def prep_cmd(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Spark prep of a window: quarantine with reasons, redact PII, dedupe, SFT examples, splits, manifest."""
    from pipelines import tasks

    with console.status("Spark prep ..."):
        result = tasks.prep(_window_arg(end_date, window_days))
    _emit(result, as_json, result["message"])


@app.command("validate")
def validate_cmd(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Great Expectations gates on the window's raw logs and curated examples (exit 1 when a gate fails)."""
    from pipelines.quality.gates import run_gates
    from pipelines.window import DateWindow

    w = _window_arg(end_date, window_days)
    with console.status("Great Expectations ..."):
        report = run_gates(get_settings(), DateWindow.parse(w["start"], w["end"]), raise_on_failure=False)
    _emit({"success": report.success, "failures": report.failures, "data_docs": report.data_docs,
           "result": report.result_uri, "quarantined_to": report.quarantined_to}, as_json, "quality gates")
    if not report.success:
        raise typer.Exit(1)


@features_app.command("apply")
def features_apply(as_json: JsonOpt = False) -> None:
    """Register the entities, feature views and feature service of feature_repo/ in the Feast registry."""
    from pipelines.clients import feast

    _emit({"applied": feast.apply(get_settings())}, as_json, "feast apply")


@features_app.command("materialize")
def features_materialize(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Compute the window's feature snapshots (Spark), register them, and load them into the online store."""
    from pipelines.clients import feast
    from pipelines.features.pipeline import compute_features, materialize_window
    from pipelines.window import DateWindow

    settings = get_settings()
    w = _window_arg(end_date, window_days)
    window = DateWindow.parse(w["start"], w["end"])
    with console.status("computing features ..."):
        customers, categories = compute_features(settings, window)
        feast.apply(settings)
        materialize_window(settings, window)
    _emit({"customer_rows": customers, "category_rows": categories,
           "online_store": redact_uri(settings.feast.online_store)},
          as_json, "feast materialize")


@features_app.command("build")
def features_build(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Compute, apply, materialize, and write the training set with point-in-time customer context."""
    from pipelines import tasks

    with console.status("features ..."):
        result = tasks.features(_window_arg(end_date, window_days))
    _emit(result, as_json, "features")


@features_app.command("context")
def features_context(customer_id: Annotated[str, typer.Argument(help="e.g. cus_0000042")]) -> None:
    """Print a customer's prompt context from the online store (what serving adds to the prompt)."""
    from pipelines.features.pipeline import online_context

    sys.stdout.write((online_context(customer_id, get_settings()) or "(no context)") + "\n")


@app.command("run")
def run_cmd(
    end_date: EndOpt = None,
    window_days: DaysOpt = 1,
    records_per_day: Annotated[int, typer.Option(min=1, help="Synthetic records per day.")] = 1500,
    source: Annotated[str, typer.Option(help="synthetic (generate traffic) or landed (the agent's logs).")] = "synthetic",
    bad_share: Annotated[float, typer.Option(min=0.0, max=1.0)] = 0.05,
    drift: Annotated[str, typer.Option(help="none, holiday, new-category, locale, tool-mix")] = "none",
    seed: Annotated[int, typer.Option(help="0: derived from the date")] = 0,
    scheduler: Annotated[bool, typer.Option(help="Trigger through the running scheduler (REST) instead of "
                                            "`airflow dags test`.")] = False,
    train: Annotated[bool, typer.Option(help="Train, evaluate, register and promote after the data path.")] = True,
    sweep: Annotated[str | None, typer.Option(help="Sweep file (default: train.sweep in the config).")] = None,
    deploy: Annotated[bool, typer.Option(help="Deploy the champion to Triton, smoke-test and benchmark it.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Run the commerce_flywheel DAG for a window (in-process `dags test`, or via `flywheel up`'s scheduler)."""
    from pipelines.clients import airflow

    conf = {"end_date": end_date, "window_days": window_days, "records_per_day": records_per_day,
            "source": source, "bad_share": bad_share, "drift": drift, "seed": seed, "train": train,
            "sweep": str(Path(sweep).resolve()) if sweep else None, "deploy": deploy}
    if end_date:
        _parse_date(end_date, "--end-date")
    settings = get_settings()
    if scheduler:
        rest = airflow.AirflowRest(settings)
        limit = settings.airflow.run_timeout_s
        with console.status("waiting for the DAG run ..."):
            state = airflow.trigger_and_wait(rest, "commerce_flywheel", conf, timeout_s=limit)
        if state["state"] == "timeout":
            raise UserError(f"commerce_flywheel run {state['dag_run_id']} did not finish within {limit:g} s "
                            f"(airflow.run_timeout_s); it goes on in the scheduler: see {airflow.base_url(settings)}")
        _emit(state, as_json, f"commerce_flywheel: {state['state']}")
        if state["state"] != "success":
            raise typer.Exit(1)
        return
    log = Path(str(settings.root)) / "logs" / "dags-test.log"
    with console.status(f"airflow dags test commerce_flywheel (progress: {log}) ..."):
        result = airflow.dags_test(settings, "commerce_flywheel", conf, log=log)
    ok = result.returncode == 0 and "state=success" in result.stdout + result.stderr
    _emit({"state": "success" if ok else "failed", "log": str(log)}, as_json, "commerce_flywheel")
    if not ok:
        raise typer.Exit(1)


# ---- train, evaluate, registry --------------------------------------------------------------
registry_app = typer.Typer(help="Browse and move the adapter registry's aliases (MLflow).", no_args_is_help=True)
app.add_typer(registry_app, name="registry")


@app.command("train")
def train_cmd(
    sweep: Annotated[str | None, typer.Option(help="Sweep file (YAML); default: train.sweep in the config.")] = None,
    backend: Annotated[str | None, typer.Option(help="hf or nemo: override the sweep file's backend.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a LoRA sweep on the latest training set: one MLflow child run per variant, best one picked."""
    from pipelines.train.sweep import load_sweep, run_sweep

    settings = get_settings()
    if backend not in (None, "hf", "nemo"):
        raise UserError(f"--backend: expected hf or nemo, got {backend!r}")
    result = run_sweep(settings, load_sweep(sweep or settings.train.sweep, backend or settings.train.backend),
                       console)
    rows = {f"variant {v.index}": f"{v.status}; " + ", ".join(f"{k}={x:.3g}" for k, x in v.metrics.items()
                                                              if k.startswith("val_") or k in ("final_loss", "tokens_per_s"))
            for v in result.variants}
    _emit({"sweep": result.sweep_id, "parent run": result.parent_run_id, **rows, "best": result.best,
           "result": result.uri} if not as_json else result.to_dict(), as_json, "sweep")


@app.command("eval")
def eval_cmd(
    adapter: Annotated[list[str] | None, typer.Option(help="Adapter folder(s) to evaluate (label=path or path).")] = None,
    version: Annotated[list[str] | None, typer.Option(help="Registered version(s) or alias(es), e.g. champion.")] = None,
    logs: Annotated[str | None, typer.Option(help="Evaluate on this log file (our log format) instead of a split.")] = None,
    split: Annotated[str, typer.Option(help="train, val or test")] = "test",
    examples: Annotated[int | None, typer.Option(min=1, help="Requests (seeded sample).")] = None,
    base_model: Annotated[str, typer.Option(help="Base model of the adapters (catalogue name or path).")] = "smollm2-135m-instruct",
    shots: Annotated[int | None, typer.Option(min=0, help="In-context examples for the few-shot baseline.")] = None,
    baselines: Annotated[bool, typer.Option(help="Include base zero-shot and few-shot.")] = True,
    constrained: Annotated[str | None, typer.Option(help="off, on or both: decode under the offered tools' grammar "
                                                    "(default: evaluation.constrained)")] = None,
    name: Annotated[str, typer.Option(help="Report folder name under reports/evaluation/.")] = "manual",
    as_json: JsonOpt = False,
) -> None:
    """Evaluate base zero-shot, base few-shot and tuned adapters side by side (JSON + HTML report)."""
    from pipelines.evaluate.pipeline import Adapter, EvalConfig, evaluate
    from pipelines.registry.models import adapter_path, alias_version, prompt_style

    settings = get_settings()
    if split not in ("train", "val", "test"):
        raise UserError(f"--split: expected train, val or test, got {split!r}")
    if constrained not in (None, "off", "on", "both"):
        raise UserError(f"--constrained: expected off, on or both, got {constrained!r}")
    adapters = []
    for item in adapter or []:
        label, _, path = item.rpartition("=")
        if not Path(path, "adapter_config.json").is_file():
            raise UserError(f"--adapter: no adapter_config.json in {path}")
        adapters.append(Adapter(label or f"tuned_{Path(path).parent.name}", path))
    for ref in version or []:
        number = ref if ref.isdigit() else alias_version(settings, ref)
        if number is None:
            raise UserError(f"--version: no version or alias {ref!r} in {settings.mlflow.registered_model}")
        adapters.append(Adapter(f"tuned_v{number}", adapter_path(settings, number), prompt_style(settings, number)))
    cfg = EvalConfig(base_model=base_model, split=split, logs=logs, baselines=baselines,
                     examples=examples or settings.evaluation.examples,
                     shots=settings.evaluation.shots if shots is None else shots,
                     constrained=constrained or settings.evaluation.constrained,
                     max_new_tokens=settings.evaluation.max_new_tokens)
    report = evaluate(settings, cfg, adapters, name, console)
    if as_json:
        _emit(report.to_dict(), True, "")
        return
    table = Table(title=f"evaluation on {report.examples} requests ({report.html_uri})")
    for column in ("condition", "exact_match", "name_accuracy", "arg_f1", "prompt_tokens_mean", "latency_ms_p50"):
        table.add_column(column)
    for row in report.table():
        table.add_row(*(f"{row[c]:.3f}" if isinstance(row[c], float) and c != "latency_ms_p50" else str(row[c])
                        for c in ("condition", "exact_match", "name_accuracy", "arg_f1", "prompt_tokens_mean",
                                  "latency_ms_p50")))
    Console().print(table)


@registry_app.command("list")
def registry_list(as_json: JsonOpt = False) -> None:
    """Every registered version with its aliases, sweep and gate decision."""
    from pipelines.clients.mlflow import client

    settings = get_settings()
    name = settings.mlflow.registered_model
    registry = client(settings)
    versions = registry.search_model_versions(f"name='{name}'")
    aliases: dict[str, list[str]] = {}  # search results carry no aliases; the registered model does
    if versions:
        for alias, number in sorted(registry.get_registered_model(name).aliases.items()):
            aliases.setdefault(str(number), []).append(alias)
    rows = [{"version": v.version, "aliases": aliases.get(str(v.version), []),
             "sweep": v.tags.get("flywheel.sweep_id"),
             "base_model": v.tags.get("flywheel.base_model"), "gate": v.tags.get("flywheel.gate", "")}
            for v in sorted(versions, key=lambda v: int(v.version))]
    _emit({"versions": rows} if as_json else {f"v{r['version']}": r for r in rows}, as_json,
          settings.mlflow.registered_model)


@registry_app.command("history")
def registry_history(as_json: JsonOpt = False) -> None:
    """Champion changes: promotions and rollbacks, with their reasons."""
    from pipelines.registry.models import history

    entries = history(get_settings())
    _emit({"history": entries} if as_json else {f"{i}. {e.get('at', '')}": e for i, e in enumerate(entries, 1)},
          as_json, "champion history")


@registry_app.command("rollback")
def registry_rollback(as_json: JsonOpt = False) -> None:
    """Point `champion` back at the version it replaced."""
    from pipelines.registry.models import RegistryError, rollback

    try:
        _emit(rollback(get_settings()), as_json, "rollback")
    except RegistryError as exc:
        raise UserError(str(exc)) from None


# ---- serving (Triton) -------------------------------------------------------------------------
serve_app = typer.Typer(help="The local Triton server (the real tritonserver binary, 127.0.0.1).", no_args_is_help=True)
app.add_typer(serve_app, name="serve")


@serve_app.command("up")
def serve_up(as_json: JsonOpt = False) -> None:
    """Start Triton with explicit model control (models load on `flywheel deploy`)."""
    from pipelines.serve import server

    with console.status("starting Triton ..."):
        _emit(server.up(_local_settings("serve up")).to_dict(), as_json, "triton is up")


@serve_app.command("down")
def serve_down(as_json: JsonOpt = False) -> None:
    """Stop Triton and every model process it started."""
    from pipelines.serve import server

    _emit({"stopped": server.down(_local_settings("serve down"))}, as_json, "triton")


@serve_app.command("status")
def serve_status(as_json: JsonOpt = False) -> None:
    """Whether Triton runs, which models are loaded and which one takes traffic."""
    from pipelines.serve import deploy as serving, server
    from pipelines.serve.client import TritonClient

    settings = get_settings()
    row: dict[str, Any] = server.status(settings).to_dict()
    if row["healthy"]:
        client = TritonClient(settings)
        row["loaded"] = client.loaded()
        client.close()
    current = serving.state(settings)
    row.update(live=current.get("live"), previous=current.get("previous"))
    _emit(row, as_json, "triton")


@serve_app.command("manifests")
def serve_manifests(
    out: Annotated[Path, typer.Option(help="Folder for the YAML files (kubectl apply -f FOLDER).")],
    replicas: Annotated[int, typer.Option(min=1, help="Triton pods.")] = 2,
    gpus: Annotated[int, typer.Option(min=1, help="GPUs per Triton pod.")] = 1,
    role_arn: Annotated[str | None, typer.Option(help="IAM role of the `triton` service account "
                                                 "(terraform output service_account_roles.triton).")] = None,
    region: Annotated[str, typer.Option(help="AWS region of the model repository bucket.")] = "us-east-1",
    as_json: JsonOpt = False,
) -> None:
    """Kubernetes manifests for Triton on the cluster (official image, model repository on S3, GPU
    pool), and the training pods' settings ConfigMap."""
    import yaml

    from pipelines.serve.kubernetes import triton_manifests
    from pipelines.train.kubernetes import settings_config_map

    settings = get_settings()
    try:
        docs = triton_manifests(settings, replicas=replicas, gpus=gpus, role_arn=role_arn, region=region)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    files = {"triton.yaml": docs, "flywheel-settings.yaml": [settings_config_map(settings)]}
    for name, manifests in files.items():
        (out / name).write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    _emit({"files": [str(out / name) for name in files], "objects": sum(len(m) for m in files.values())},
          as_json, "kubernetes manifests")


@app.command("deploy")
def deploy_cmd(
    alias: Annotated[str, typer.Option(help="Registry alias to deploy.")] = "champion",
    version: Annotated[str | None, typer.Option(help="A version number instead of an alias.")] = None,
    canary: Annotated[float | None, typer.Option(min=0.0, max=1.0, help="Serve the alias next to the live "
                                                 "model: it answers replayed test rows, then this share of the "
                                                 "gateway's live `champion` traffic (the live gate watches it).")] = None,
    requests: Annotated[int, typer.Option(min=1, help="Replayed requests before a canary takes live traffic.")] = 8,
    replay_only: Annotated[bool, typer.Option(help="--canary: compare on replayed rows only; live traffic "
                                              "untouched.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Load a registered adapter into Triton, smoke-test it with real requests, then switch traffic to it."""
    from pipelines.serve import deploy as serving
    from pipelines.serve.live_report import start_canary

    settings = get_settings()
    with console.status("deploying ..."):
        if canary is not None and replay_only:
            result = serving.canary(settings, alias, share=canary, requests=requests)
        elif canary is not None:
            result = start_canary(settings, alias, share=canary, requests=requests)
        else:
            result = serving.deploy(settings, alias, version=version)
    _emit(result, as_json, "canary" if canary is not None else "deployed")


@app.command("rollback")
def rollback_cmd(as_json: JsonOpt = False) -> None:
    """Send traffic back to the previously deployed model (it stays loaded: seconds)."""
    from pipelines.serve import deploy as serving

    _emit(serving.rollback(get_settings()), as_json, "rolled back")


@app.command("bench")
def bench_cmd(
    requests: Annotated[int | None, typer.Option(min=1, help="Test requests per model and level.")] = None,
    concurrency: Annotated[str | None, typer.Option(help="Comma-separated levels, e.g. 1,2,4.")] = None,
    protocol: Annotated[str | None, typer.Option(help="http or grpc.")] = None,
    aiperf: Annotated[bool, typer.Option("--aiperf", help="Measure through the gateway with NVIDIA AIPerf "
                                         "(streamed; `make aiperf-env` first) instead of the Triton client.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark the live model against base + few-shot through Triton (latency, throughput, tokens, cost)."""
    from pydantic import ValidationError

    from pipelines.bench.serving import run_bench
    from pipelines.config import BenchSettings

    settings = get_settings()
    overrides: dict[str, Any] = {"requests": requests, "protocol": protocol}
    if concurrency:
        try:
            overrides["concurrency"] = [int(v) for v in concurrency.split(",")]
        except ValueError:
            raise UserError(f"--concurrency: expected numbers like 1,2,4, got {concurrency!r}") from None
    try:
        cfg = BenchSettings(**{**settings.bench.model_dump(), **{k: v for k, v in overrides.items() if v is not None}})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"bench.{first['loc'][0]}: {first['msg'].removeprefix('Value error, ')}") from None
    if aiperf:
        from pipelines.bench.aiperf import AiperfFailed, COLUMNS, run_aiperf

        try:
            result = run_aiperf(settings, cfg.requests, cfg.concurrency, say=console.print)
        except AiperfFailed as exc:
            raise UserError(str(exc)) from None
        if as_json:
            _emit(result, True, "bench")
            return
        _print_table(f"AIPerf {result['aiperf']} through the gateway: {result['html_uri']}", COLUMNS,
                     [["n/a" if run.get(c) is None else str(run.get(c)) for c in COLUMNS] for run in result["runs"]])
        return
    report = run_bench(settings, cfg, console=console)
    if as_json:
        _emit(report, True, "bench")
        return
    from pipelines.bench.serving import TABLE_COLUMNS, table_rows

    _print_table(f"serving benchmark ({report['hardware']['name']}): {report['html_uri']}", TABLE_COLUMNS,
                 table_rows(report))


def _print_table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console().print(table)


# ---- local servers --------------------------------------------------------------------------
@app.command("up")
def up(
    only: Annotated[str | None, typer.Option(help="Start just one server: airflow, mlflow or gateway.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start the local MLflow server, Airflow (standalone) and the OpenAI-compatible gateway, bound to
    127.0.0.1; wait until healthy."""
    from pipelines.clients import airflow, mlflow
    from pipelines.services import start

    settings = _local_settings("up")
    results = {}
    names = _service_names(only)
    if "mlflow" in names:
        console.print("starting MLflow ...")
        results["mlflow"] = start(str(settings.root), mlflow.server_spec(settings),
                                  host=settings.mlflow.host, port=settings.mlflow.port).to_dict()
        if settings.mlflow.auth:
            results["mlflow"]["username"] = mlflow.ADMIN
            results["mlflow"]["password_file"] = str(Path(str(settings.root)) / "runs" / "mlflow-admin.password")
    if "airflow" in names:
        console.print("starting Airflow standalone (about 30 s) ...")
        tracking = ({"FLYWHEEL_MLFLOW__TRACKING_URI": mlflow.server_url(settings), **mlflow.server_credentials(settings)}
                    if "mlflow" in names else {})
        results["airflow"] = start(str(settings.root), airflow.standalone_spec(settings, tracking),
                                   host=settings.airflow.host, port=settings.airflow.port).to_dict()
        results["airflow"]["password_file"] = str(airflow.password_file(settings))
        results["airflow"]["username"] = "admin"
    if "gateway" in names:
        from pipelines.serve import gateway

        console.print("starting the gateway ...")
        gateway.up(settings)
        results["gateway"] = gateway.status(settings)
    _emit(results, as_json, "flywheel is up")


@app.command("down")
def down(as_json: JsonOpt = False) -> None:
    """Stop every local server started by `flywheel up`, with all the processes they forked."""
    from pipelines.services import stop

    settings = _local_settings("down")
    stopped = {name: stop(str(settings.root), name) for name in ("gateway", "airflow", "mlflow", "triton")}
    _emit({"stopped": [n for n, s in stopped.items() if s]}, as_json, "flywheel is down")


@app.command("status")
def status_cmd(as_json: JsonOpt = False) -> None:
    """Show which local servers run, whether they answer, and where."""
    from pipelines.clients import airflow, mlflow
    from pipelines.serve import gateway
    from pipelines.services import status

    settings = get_settings()
    root = str(settings.root)
    a = airflow.standalone_spec(settings)
    m = mlflow.server_spec(settings)
    rows = {
        "airflow": status(root, "airflow", a.health_url, a.url).to_dict(),
        "mlflow": status(root, "mlflow", m.health_url, m.url).to_dict(),
        "gateway": gateway.status(settings),
    }
    _emit(rows, as_json, f"flywheel status ({settings.profile} profile, root {root})")


# ---- demo -----------------------------------------------------------------------------------
@app.command("demo")
def demo(
    part: Annotated[str, typer.Argument(help="flywheel (the whole flywheel) or drift (after it: drifted traffic, "
                                        "alert, retrain, gate, deployment)")] = "flywheel",
    records_per_day: Annotated[int, typer.Option(min=10, help="Generated records per day.")] = 1500,
    days: Annotated[int, typer.Option(min=1, help="Days of traffic to generate.")] = 7,
    seed: Annotated[int, typer.Option(help="Seed of the demo traffic.")] = 7,
) -> None:
    """Run the whole flywheel on embedded defaults and say where every output is; `demo drift` then
    shows drift monitoring retraining by itself."""
    from pipelines.demo import run_demo, run_drift_demo

    if part == "flywheel":
        run_demo(get_settings(), records_per_day=records_per_day, days=days, seed=seed, console=console)
    elif part == "drift":
        run_drift_demo(get_settings(), records=records_per_day, seed=seed + 100, console=console)
    else:
        raise UserError(f"demo: expected flywheel or drift, got {part!r}")


drift_app = typer.Typer(help="Drift monitoring: compare the latest logs with the champion's training data.",
                        no_args_is_help=True)
app.add_typer(drift_app, name="drift")


@drift_app.command("check")
def drift_check_cmd(end_date: EndOpt = None, as_json: JsonOpt = False) -> None:
    """Run the drift monitor once (what the hourly drift_monitor DAG does) and print its verdict."""
    from pipelines.drift.monitor import run_monitor

    end = _parse_date(end_date, "--end-date") if end_date else None
    with console.status("checking drift ..."):
        result = run_monitor(get_settings(), end)
    if as_json:
        _emit(result, True, "drift")
        return
    table = Table(title=f"drift {result['window']['start']}..{result['window']['end']}: {result['verdict']}"
                        f"{' (alert)' if result['fire'] else ''}")
    for column in ("signal", "metric", "value", "band"):
        table.add_column(column)
    for s in result["signals"]:
        table.add_row(s["signal"], s["metric"], f"{s['value']:g}", s["band"])
    Console().print(table)
    console.print(f"report: {result.get('html_uri', '-')}  {result.get('reason', '')}")


# ---- helpers --------------------------------------------------------------------------------
def _parse_date(value: str | None, option: str) -> date:
    if value is None:
        return datetime.now(timezone.utc).date()
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise UserError(f"{option}: expected a date like 2026-11-22, got {value!r}") from None


def _service_names(only: str | None) -> tuple[str, ...]:
    if only is None:
        return ("mlflow", "airflow", "gateway")
    if only not in ("mlflow", "airflow", "gateway"):
        raise UserError(f"--only: expected airflow, mlflow or gateway, got {only!r}")
    return (only,)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage and configuration errors become one line on stderr and exit code 2."""
    from pipelines.demo import DemoFailed
    from pipelines.errors import NotRetryable
    from pipelines.services import ServiceError

    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="flywheel", standalone_mode=False)
        if isinstance(code, int) and code:  # click returns (not raises) typer.Exit's code here
            sys.exit(code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except TyperException as exc:  # usage errors: unknown command, bad option value, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        sys.stderr.write(f"error: {message}\n")
        sys.exit(2)
    except (ConfigError, UserError, ServiceError, DemoFailed, NotRetryable) as exc:
        sys.stderr.write(f"error: {mask_uri_passwords(str(exc))}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 (MLflow, Triton, a corrupt file, ...: one line, the traceback kept)
        sys.stderr.write(f"error: {one_line(exc)} (traceback: {keep_traceback(exc, _logs_folder())})\n")
        sys.exit(1)


def _logs_folder() -> Path:
    import tempfile

    try:
        return Path(str(get_settings().root)) / "logs"
    except Exception:  # noqa: BLE001 (a broken configuration: still keep the traceback)
        return Path(tempfile.gettempdir())


if __name__ == "__main__":
    main()
