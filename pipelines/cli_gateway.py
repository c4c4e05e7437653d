"""`flywheel gateway up|down|status`: the OpenAI-compatible endpoint (pipelines/serve/gateway.py)."""

from __future__ import annotations

import typer

from pipelines.cli_common import JsonOpt, console, emit, local_settings

gateway_app = typer.Typer(help="The OpenAI-compatible gateway in front of the served models (127.0.0.1, API key).",
                          no_args_is_help=True)


@gateway_app.command("up")
def gateway_up(as_json: JsonOpt = False) -> None:
    """Start the gateway (idempotent); Triton must be up for it to answer (`flywheel serve up`)."""
    from pipelines.serve import gateway

    settings = local_settings("gateway up")
    with console.status("starting the gateway ..."):
        gateway.up(settings)
    emit(gateway.status(settings), as_json, "gateway is up")


@gateway_app.command("down")
def gateway_down(as_json: JsonOpt = False) -> None:
    """Stop the gateway; it finishes the requests in flight first (their records are captured)."""
    from pipelines.serve import gateway

    emit({"stopped": gateway.down(local_settings("gateway down"))}, as_json, "gateway")


@gateway_app.command("status")
def gateway_status(as_json: JsonOpt = False) -> None:
    """Whether the gateway runs, its OpenAI base URL and the file holding its API key."""
    from pipelines.config import get_settings
    from pipelines.serve import gateway

    emit(gateway.status(get_settings()), as_json, "gateway")
