"""The local platform: up, down, status, the demo and drift checks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from pipelines.cli.common import EndOpt, JsonOpt, UserError, cli_settings, console, stdout_console
from pipelines.cli.common import emit as _emit
from pipelines.cli.common import local_settings as _local_settings
from pipelines.cli.common import parse_date as _parse_date

app = typer.Typer()  # this module's top-level commands (merged into `flywheel`)


@app.command("up")
def up(
    only: Annotated[str | None, typer.Option(help="Start just one server: airflow, mlflow or gateway.")] = None,
    paused: Annotated[
        bool,
        typer.Option(
            "--paused",
            help="Leave the DAGs paused (default: airflow.schedules, "
            "active: the drift monitor runs hourly, the flywheel daily)",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Start the local MLflow server, Airflow (standalone) and the OpenAI-compatible gateway, bound to
    127.0.0.1; wait until healthy. The DAGs then run on their schedules (unless paused)."""
    from pipelines.config import DEFAULT_PROJECT
    from pipelines.projects import settings_for

    settings = settings_for(_local_settings("up"), DEFAULT_PROJECT)  # the servers are the platform's, not a project's
    results: dict[str, Any] = {}
    names = _service_names(only)
    if "mlflow" in names:
        results["mlflow"] = _start_mlflow(settings)
    if "airflow" in names:
        results["airflow"] = _start_airflow(settings, with_mlflow="mlflow" in names, paused=paused)
    if "gateway" in names:
        results.update(_restore_serving(settings))
        from pipelines.gateway import app as gateway

        console.print("starting the gateway ...")
        gateway.up(settings)
        results["gateway"] = gateway.status(settings)
    _emit(results, as_json, "flywheel is up")


def _start_mlflow(settings: Any) -> dict[str, Any]:
    """The tracking server, then each project's members' grants on it."""
    from pipelines.clients import mlflow
    from pipelines.services import start

    console.print("starting MLflow ...")
    result = start(
        str(settings.root), mlflow.server_spec(settings), host=settings.mlflow.host, port=settings.mlflow.port
    ).to_dict()
    if settings.mlflow.auth:
        result["username"] = mlflow.ADMIN
        result["password_file"] = str(Path(str(settings.root)) / "runs" / "mlflow-admin.password")
        from pipelines.projects import access

        result["projects"] = access.sync_all(settings)  # each project's members' grants
    return result


def _start_airflow(settings: Any, *, with_mlflow: bool, paused: bool) -> dict[str, Any]:
    """Airflow standalone (the project teams prepared first), then every project's DAGs paused or resumed."""
    from pipelines.clients import airflow, mlflow
    from pipelines.projects import airflow_access
    from pipelines.stack import airflow as airflow_server

    console.print("starting Airflow standalone (about 30 s) ...")
    tracking = (
        {"FLYWHEEL_MLFLOW__TRACKING_URI": mlflow.server_url(settings), **mlflow.server_credentials(settings)}
        if with_mlflow
        else {}
    )
    airflow_access.prepare(settings)  # airflow.multi_team: each project's team, DAG bundle and logins
    if paused:  # a fresh Airflow creates the DAGs paused: no run starts before the REST call below lands
        tracking["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "True"
        # and DAGs a `flywheel run` (dags test) created already are paused in the metadata DB before the
        # scheduler starts (else it starts their latest daily interval before the pause lands); a root with
        # no Airflow DB yet has none to pause (the command's error is that, and ignored)
        if Path(str(settings.airflow.home)).is_dir():
            airflow_server.run_cli(settings, "dags", "pause", ".*", "--treat-dag-id-as-regex", "-y", timeout=300)
    from pipelines.services import start

    result = start(
        str(settings.root),
        airflow_server.standalone_spec(settings, tracking),
        host=settings.airflow.host,
        port=settings.airflow.port,
    ).to_dict()
    result["password_file"] = str(airflow.password_file(settings))
    result["username"] = "admin"
    result["schedules"] = _apply_schedules(settings, hold=paused or settings.airflow.schedules == "paused")
    return result


def _apply_schedules(settings: Any, *, hold: bool) -> dict[str, str]:
    """Every project's DAGs paused (`hold`) or resumed, each printed in one line."""
    from pipelines import schedules
    from pipelines.clients import airflow
    from pipelines.config import DEFAULT_PROJECT
    from pipelines.projects import registry, settings_for

    rows = schedules.set_paused(settings, hold)
    for name in registry.load(settings):  # every project's DAGs follow the same setting
        if name != DEFAULT_PROJECT:
            try:
                rows += schedules.set_paused(settings_for(settings, name), hold)
            except airflow.AirflowUnavailable as exc:
                console.print(f"[red]project {name}: its DAGs were not {'paused' if hold else 'resumed'}: {exc}[/red]")
    for row in rows:
        console.print(schedules.one_line(row), soft_wrap=True, highlight=False)
    return {r["dag"]: r["state"] for r in rows}


def _restore_serving(settings: Any) -> dict[str, Any]:
    """What was serving, every project's (the platform's first): back before the front door opens; one
    project's broken deployment is reported and never keeps the others (or the gateway) down."""
    from pipelines.config import DEFAULT_PROJECT
    from pipelines.errors import one_line
    from pipelines.projects import registry, settings_for
    from pipelines.serve import deploy

    results: dict[str, Any] = {}
    for name in sorted(registry.load(settings), key=lambda n: n != DEFAULT_PROJECT):
        key = "triton" if name == DEFAULT_PROJECT else f"triton:{name}"
        try:
            scoped = settings_for(settings, name)
            if deploy.state(scoped).get("live"):
                console.print(f"starting Triton and restoring {name}'s live deployment ...")
                results[key] = deploy.restore(scoped)
        except Exception as exc:  # noqa: BLE001 (reported in the result, one line)
            results[key] = {"error": f"not restored: {one_line(exc)}"}
            console.print(f"[red]{name}: not restored: {one_line(exc)}[/red]")
    return results


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
    from pipelines.gateway import app as gateway
    from pipelines.services import status

    settings = cli_settings()
    root = str(settings.root)
    a = airflow.base_url(settings)  # no standalone_spec: its environment is not needed to ask
    m = mlflow.server_spec(settings)
    rows = {
        "airflow": status(root, "airflow", f"{a}{airflow.HEALTH_PATH}", a).to_dict(),
        "mlflow": status(root, "mlflow", m.health_url, m.url).to_dict(),
        "gateway": gateway.status(settings),
    }
    dags: list[str] = []
    if rows["airflow"].get("healthy"):
        from pipelines import schedules

        try:
            described = schedules.describe(settings)
            rows["airflow"]["dags"] = described
            dags = [schedules.one_line(r) for r in described]
        except airflow.AirflowUnavailable as exc:
            rows["airflow"]["dags"] = dags = [f"DAGs unknown: {exc}"]
    _emit(rows, as_json, f"flywheel status ({settings.profile} profile, root {root})")
    if not as_json:
        for line in dags:
            print(line)


schedules_app = typer.Typer(help="What runs on its own: the DAGs' schedules, next and last runs; pause and resume.")


@schedules_app.callback(invoke_without_command=True)
def schedules_show(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Per DAG: active or paused, its schedule, the next run, the last run, its state and its trigger."""
    if ctx.invoked_subcommand is not None:
        return
    from pipelines import schedules

    rows = schedules.describe(_local_settings("schedules"))
    if as_json:
        _emit({"dags": rows}, True, "")
        return
    for row in rows:
        print(schedules.one_line(row))


def _switch(dag: str | None, paused: bool, as_json: bool) -> None:
    from pipelines import schedules

    rows = schedules.set_paused(_local_settings("schedules"), paused, dag)
    if as_json:
        _emit({"dags": rows}, True, "")
        return
    for row in rows:
        print(schedules.one_line(row))


DagArg = Annotated[str | None, typer.Argument(help="commerce_flywheel or drift_monitor (default: both)")]


@schedules_app.command("pause")
def schedules_pause(dag: DagArg = None, as_json: JsonOpt = False) -> None:
    """Pause the DAGs (or one): nothing starts on its own until `resume`."""
    _switch(dag, True, as_json)


@schedules_app.command("resume")
def schedules_resume(dag: DagArg = None, as_json: JsonOpt = False) -> None:
    """Resume the DAGs (or one): their schedules run again (catchup off: the latest interval, not every missed one)."""
    _switch(dag, False, as_json)


@app.command("demo")
def demo(
    part: Annotated[
        str,
        typer.Argument(
            help="flywheel (the whole flywheel) or drift (after it: drifted traffic, alert, retrain, gate, deployment)"
        ),
    ] = "flywheel",
    records_per_day: Annotated[int, typer.Option(min=10, help="Generated records per day.")] = 1500,
    days: Annotated[int, typer.Option(min=1, help="Days of traffic to generate.")] = 7,
    seed: Annotated[int, typer.Option(help="Seed of the demo traffic.")] = 7,
) -> None:
    """Run the whole flywheel on embedded defaults and say where every output is; `demo drift` then
    shows drift monitoring retraining by itself."""
    from pipelines.demo import run_demo
    from pipelines.demo_drift import run_drift_demo

    if part == "flywheel":
        run_demo(cli_settings(), records_per_day=records_per_day, days=days, seed=seed, console=console)
    elif part == "drift":
        run_drift_demo(cli_settings(), records=records_per_day, seed=seed + 100, console=console)
    else:
        raise UserError(f"demo: expected flywheel or drift, got {part!r}")


drift_app = typer.Typer(
    help="Drift monitoring: compare the latest logs with the champion's training data.", no_args_is_help=True
)


@drift_app.command("check")
def drift_check_cmd(end_date: EndOpt = None, as_json: JsonOpt = False) -> None:
    """Run the drift monitor once (what the hourly drift_monitor DAG does) and print its verdict."""
    from pipelines.drift.monitor import run_monitor

    end = _parse_date(end_date, "--end-date") if end_date else None
    with console.status("checking drift ..."):
        result = run_monitor(cli_settings(), end)
    if as_json:
        _emit(result, True, "drift")
        return
    table = Table(
        title=f"drift {result['window']['start']}..{result['window']['end']}: {result['verdict']}"
        f"{' (alert)' if result['fire'] else ''}"
    )
    for column in ("signal", "metric", "value", "band"):
        table.add_column(column)
    for s in result["signals"]:
        table.add_row(s["signal"], s["metric"], f"{s['value']:g}", s["band"])
    stdout_console().print(table)
    console.print(f"report: {result.get('html_uri', '-')}  {result.get('reason', '')}")


def _service_names(only: str | None) -> tuple[str, ...]:
    if only is None:
        return ("mlflow", "airflow", "gateway")
    if only not in ("mlflow", "airflow", "gateway"):
        raise UserError(f"--only: expected airflow, mlflow or gateway, got {only!r}")
    return (only,)
