"""`flywheel gateway up|down|status`: the OpenAI-compatible endpoint (pipelines/gateway/)."""

from __future__ import annotations

from typing import Annotated

import typer

from pipelines.cli.common import JsonOpt, cli_settings, console, emit, local_settings

gateway_app = typer.Typer(
    help="The OpenAI-compatible gateway in front of the served models (127.0.0.1, API key).", no_args_is_help=True
)


@gateway_app.command("up")
def gateway_up(as_json: JsonOpt = False) -> None:
    """Start the gateway (idempotent); Triton must be up for it to answer (`flywheel serve up`)."""
    from pipelines.gateway import app as gateway

    settings = local_settings("gateway up")
    with console.status("starting the gateway ..."):
        gateway.up(settings)
    emit(gateway.status(settings), as_json, "gateway is up")


@gateway_app.command("down")
def gateway_down(as_json: JsonOpt = False) -> None:
    """Stop the gateway; it finishes the requests in flight first (their records are captured)."""
    from pipelines.gateway import app as gateway

    emit({"stopped": gateway.down(local_settings("gateway down"))}, as_json, "gateway")


@gateway_app.command("status")
def gateway_status(as_json: JsonOpt = False) -> None:
    """Whether the gateway runs, its OpenAI base URL and the file holding its API key."""
    from pipelines.gateway import app as gateway

    emit(gateway.status(cli_settings()), as_json, "gateway")


@gateway_app.command("route")
def gateway_route(
    model: Annotated[str, typer.Argument(help="The route: the model name agents call (e.g. champion).")],
    mode: Annotated[str | None, typer.Argument(help="serve, shadow or canary; omitted: show the routes.")] = None,
    share: Annotated[float | None, typer.Option(help="canary: the share of requests the candidate answers.")] = None,
    candidate: Annotated[
        str, typer.Option(help="The alias compared with (shadow) or given traffic (canary).")
    ] = "candidate",
    as_json: JsonOpt = False,
) -> None:
    """Put a route in a traffic mode (recorded); the gateway follows within a second."""
    from pipelines.livegate import routes

    settings = cli_settings()
    if mode is None:
        data = routes.read_routes(settings)
        emit(
            {
                "route": model,
                **routes.route_of(data, model),
                "history": [h for h in data["history"] if h["route"] == model][-10:],
            },
            as_json,
            f"route {model}",
        )
        return
    emit(
        {"route": model, **routes.set_route(settings, model, mode, share=share, candidate=candidate)},
        as_json,
        f"route {model}",
    )


@gateway_app.command("report")
def gateway_report(
    since: Annotated[str | None, typer.Option(help="Only comparisons from this ISO time on.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Live agreement of candidates with the teacher (shadow and canary traffic): HTML + JSON, MLflow."""
    from pipelines.livegate.report import build_report

    report = build_report(cli_settings(), since)
    if as_json:
        emit(report, True, "")
        return
    for row in report["summary"]:
        console.print(row)
    emit({k: report[k] for k in ("comparisons", "routes", "html_uri", "json_uri", "mlflow")}, False, "live agreement")


@gateway_app.command("gate")
def gateway_gate(
    model: Annotated[str, typer.Argument(help="The route to gate.")] = "champion",
    as_json: JsonOpt = False,
) -> None:
    """Apply the live gate now: shadow -> canary, a failing canary -> serve, a passing canary -> serve with
    its candidate deployed as the live model."""
    from pipelines.livegate.report import gate

    emit(gate(cli_settings(), model), as_json, f"live gate, route {model}")
