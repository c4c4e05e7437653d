"""config show and scan-secrets: what is configured, and that no secret leaked."""

from __future__ import annotations

import json

import typer

from pipelines.cli.common import JsonOpt, UserError, cli_settings, stdout_console
from pipelines.cli.common import emit as _emit

app = typer.Typer()  # this module's top-level commands (merged into `flywheel`)
config_app = typer.Typer(help="Show the effective configuration.", no_args_is_help=True)


@config_app.command("show")
def config_show(as_json: JsonOpt = False) -> None:
    """Print the effective settings (profile defaults + YAML + FLYWHEEL_* env); secrets are masked."""
    from pipelines.security import redact_settings

    data = redact_settings(cli_settings().model_dump(mode="json"))
    if as_json:
        _emit(data, True, "")
    else:
        stdout_console().print_json(json.dumps(data))


@app.command("scan-secrets")
def scan_secrets(as_json: JsonOpt = False) -> None:
    """Look for secrets in what the platform wrote: service and task logs, reports, MLflow params and
    tags. Finds the configured passwords and keys and credential shapes (URIs with passwords, AWS
    keys, private keys, bearer tokens); prints where, never the value. Exit 1 when anything is found."""
    from pipelines.security import scan_platform
    from pipelines.stack.airflow import generated_secrets

    settings = cli_settings()
    if not settings.is_local:
        raise UserError("scan-secrets reads the local root's logs; on a cluster scan the log store instead")
    findings = [str(f) for f in scan_platform(settings, generated_secrets(settings))]
    _emit({"findings": len(findings), "where": findings[:50]}, as_json, "secret scan")
    if findings:
        raise typer.Exit(1)
