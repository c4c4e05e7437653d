"""Serving: the local Triton server, deploy, rollback and the serving benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.common import JsonOpt, UserError, cli_settings, console
from pipelines.cli.common import emit as _emit
from pipelines.cli.common import local_settings as _local_settings
from pipelines.cli.common import print_table as _print_table

app = typer.Typer()  # this module's top-level commands (merged into `flywheel`)


serve_app = typer.Typer(help="The local Triton server (the real tritonserver binary, 127.0.0.1).", no_args_is_help=True)


@serve_app.command("up")
def serve_up(as_json: JsonOpt = False) -> None:
    """Start Triton with explicit model control, and bring back what the serving state names (the live model
    and the previous one, each smoke-tested): after a restart nothing needs deploying again."""
    from pipelines.serve import deploy
    from pipelines.stack import triton as server

    settings = _local_settings("serve up")
    with console.status("starting Triton and restoring the live deployment ..."):
        result = server.up(settings).to_dict()
        result.update(deploy.restore(settings))
    _emit(result, as_json, "triton is up")


@serve_app.command("down")
def serve_down(as_json: JsonOpt = False) -> None:
    """Stop Triton and every model process it started."""
    from pipelines.stack import triton as server

    _emit({"stopped": server.down(_local_settings("serve down"))}, as_json, "triton")


@serve_app.command("status")
def serve_status(as_json: JsonOpt = False) -> None:
    """Whether Triton runs, which models are loaded and which one takes traffic."""
    from pipelines.serve import deploy as serving
    from pipelines.serve.client import TritonClient
    from pipelines.stack import triton as server

    settings = cli_settings()
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
    role_arn: Annotated[
        str | None,
        typer.Option(help="IAM role of the `triton` service account (terraform output service_account_roles.triton)."),
    ] = None,
    region: Annotated[str, typer.Option(help="AWS region of the model repository bucket.")] = "us-east-1",
    as_json: JsonOpt = False,
) -> None:
    """Kubernetes manifests for Triton on the cluster (official image, model repository on S3, GPU pool), the
    gateway (probes: /livez, /ready), the settings ConfigMap, the Helm values for Airflow and templates of the
    Secrets they read."""
    import yaml

    from pipelines.cluster.bundle import manifest_files

    settings = cli_settings()
    try:
        files = manifest_files(settings, replicas=replicas, gpus=gpus, role_arn=role_arn, region=region)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    for name, manifests in files.items():
        (out / name).write_text(yaml.safe_dump_all(manifests, sort_keys=False))
    _emit(
        {
            "files": [str(out / name) for name in files],
            "objects": sum(len(m) for m in files.values()),
            "repository": _repository_prefix(settings),
        },
        as_json,
        "kubernetes manifests",
    )


def _repository_prefix(settings: Any) -> str:
    """Create the model repository's prefix (Triton's pods are not ready on an empty bucket), best effort:
    manifests are often written where the bucket cannot be reached (no credentials yet, CI), and then the
    result says what to do before Triton starts instead of failing the whole command."""
    from pipelines.serve.repository import README, ensure_repository

    try:
        return f"ready: {ensure_repository(settings)}"
    except Exception as exc:  # noqa: BLE001 - any storage error (credentials, network) only defers this step
        where = f"{str(settings.triton.model_repository).rstrip('/')}/{README}"
        return f"not created ({type(exc).__name__}): write {where} (or rerun this command) before Triton starts"


@app.command("deploy")
def deploy_cmd(
    alias: Annotated[str, typer.Option(help="Registry alias to deploy.")] = "champion",
    version: Annotated[str | None, typer.Option(help="A version number instead of an alias.")] = None,
    canary: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Serve the alias next to the live "
            "model: it answers replayed test rows, then this share of the "
            "gateway's live `champion` traffic (the live gate watches it).",
        ),
    ] = None,
    requests: Annotated[int, typer.Option(min=1, help="Replayed requests before a canary takes live traffic.")] = 8,
    replay_only: Annotated[
        bool, typer.Option(help="--canary: compare on replayed rows only; live traffic untouched.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Load a registered adapter into Triton, smoke-test it with real requests, then switch traffic to it."""
    from pipelines.livegate.report import start_canary
    from pipelines.serve import canary as canary_of
    from pipelines.serve import deploy as serving

    settings = cli_settings()
    with console.status("deploying ..."):
        if canary is not None and replay_only:
            result = canary_of.canary(settings, alias, share=canary, requests=requests)
        elif canary is not None:
            result = start_canary(settings, alias, share=canary, requests=requests)
        else:
            result = serving.deploy(settings, alias, version=version)
    _emit(result, as_json, "canary" if canary is not None else "deployed")


@serve_app.command("undeploy")
def undeploy_cmd(as_json: JsonOpt = False) -> None:
    """Take this project's models out of service (unloaded; nothing live). `flywheel deploy` serves again."""
    from pipelines.serve import deploy as serving

    _emit(serving.undeploy(cli_settings()), as_json, "undeployed")


@app.command("rollback")
def rollback_cmd(as_json: JsonOpt = False) -> None:
    """Send traffic back to the previously deployed model (it stays loaded: seconds)."""
    from pipelines.serve import deploy as serving

    _emit(serving.rollback(cli_settings()), as_json, "rolled back")


def _refuse_precisions_without_bf16(settings: Any, precisions: Sequence[str]) -> None:
    """A local Triton serves on this CPU unless there is a GPU: without bf16 units there, every precision would
    compute in fp32, and the comparison would time fp32 under a bf16 name (one `error:` line instead)."""
    if not precisions or settings.profile != "local":
        return
    import torch

    from pipelines.hardware import bf16_comparison_problem

    problem = None if torch.cuda.is_available() else bf16_comparison_problem(precisions)
    if problem:
        raise UserError(f"--precisions {problem}")


@app.command("bench")
def bench_cmd(
    requests: Annotated[int | None, typer.Option(min=1, help="Test requests per model and level.")] = None,
    concurrency: Annotated[str | None, typer.Option(help="Comma-separated levels, e.g. 1,2,4.")] = None,
    protocol: Annotated[str | None, typer.Option(help="http or grpc.")] = None,
    precisions: Annotated[
        str | None,
        typer.Option(help="Also time the live version at these precisions, e.g. fp32,bf16,auto (paired with fp32)."),
    ] = None,
    aiperf: Annotated[
        bool,
        typer.Option(
            "--aiperf",
            help="Measure through the gateway with NVIDIA AIPerf "
            "(streamed; `make aiperf-env` first) instead of the Triton client.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Benchmark the live model against base + few-shot through Triton (latency, throughput, tokens, cost)."""
    from pydantic import ValidationError

    from pipelines.bench.serving import run_bench
    from pipelines.config import BenchSettings

    settings = cli_settings()
    overrides: dict[str, Any] = {"requests": requests, "protocol": protocol}
    if precisions:
        overrides["precisions"] = [p.strip() for p in precisions.split(",") if p.strip()]
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
    _refuse_precisions_without_bf16(settings, cfg.precisions)
    if aiperf:
        from pipelines.bench.aiperf import COLUMNS, AiperfFailed, run_aiperf

        try:
            result = run_aiperf(settings, cfg.requests, cfg.concurrency, say=console.print)
        except AiperfFailed as exc:
            raise UserError(str(exc)) from None
        if as_json:
            _emit(result, True, "bench")
            return
        _print_table(
            f"AIPerf {result['aiperf']} through the gateway: {result['html_uri']}",
            COLUMNS,
            [["n/a" if run.get(c) is None else str(run.get(c)) for c in COLUMNS] for run in result["runs"]],
        )
        return
    report = run_bench(settings, cfg, console=console)
    if as_json:
        _emit(report, True, "bench")
        return
    from pipelines.bench.results import TABLE_COLUMNS, table_rows

    _print_table(
        f"serving benchmark ({report['hardware']['name']}): {report['html_uri']}", TABLE_COLUMNS, table_rows(report)
    )
    from pipelines.bench.report import precision_lines

    for line in precision_lines(report):
        console.print(line, soft_wrap=True, highlight=False)
    if report.get("comparison"):
        from pipelines.bench.report import change_line

        console.print(
            f"tuned vs base + few-shot: latency p50 {change_line(report['comparison'])}",
            soft_wrap=True,
            highlight=False,
        )
