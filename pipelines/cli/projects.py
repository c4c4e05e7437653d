"""`flywheel project ...`: AI projects (create, list, show, members, keys, quotas, usage, delete), and the
global `--project` every other command takes (`flywheel --project NAME run ...`, or FLYWHEEL_PROJECT)."""

from __future__ import annotations

import getpass
import os
import sys
from typing import Annotated

import typer

from pipelines.cli.common import INVOCATION, Invocation, JsonOpt, UserError, cli_settings, console, emit, print_table
from pipelines.config import DEFAULT_PROJECT

project_app = typer.Typer(
    help="AI projects: one team's logs, models, endpoints, keys and quotas, apart from the others'.",
    no_args_is_help=True,
)
key_app = typer.Typer(help="The project's gateway API keys (stored hashed, shown once).", no_args_is_help=True)
project_app.add_typer(key_app, name="key")

NameArg = Annotated[str, typer.Argument(help="the project's name (a-z, 0-9, _)")]
RpmOpt = Annotated[int | None, typer.Option("--rpm", min=1, help="gateway requests per minute (default: no limit)")]
TokensOpt = Annotated[int | None, typer.Option("--tokens-per-day", min=1, help="gateway tokens per UTC day")]
RunsOpt = Annotated[int | None, typer.Option("--training-runs", min=1, max=64, help="concurrent training runs")]
ConcurrentOpt = Annotated[int | None, typer.Option("--concurrent", min=1, help="gateway requests in flight at once")]


def select(project: str | None) -> None:
    """The global `--project`: every command after it works in that project, which must exist (`default` always
    does); checked at once, so a wrong name is one line before the command runs. Nothing else changes: the
    project is this command line's (`cli_settings`), never the process environment's."""
    from pipelines.projects import registry

    name = project or os.environ.get("FLYWHEEL_PROJECT")
    if name:
        try:
            registry.check_name(name)
        except registry.ProjectError as exc:
            raise UserError(f"--project: {exc}") from None
    INVOCATION.set(Invocation(project=project))
    if name:
        cli_settings()


def _user() -> str:
    return os.environ.get("FLYWHEEL_USER") or getpass.getuser()


def _platform():
    """The unscoped settings (the project commands address projects by name)."""
    from pipelines.projects import settings_for

    return settings_for(cli_settings(), DEFAULT_PROJECT)


def _errors():
    from pipelines.projects import ProjectError

    return ProjectError


def _sync_access(name: str, removed: tuple[str, ...] = ()) -> str:
    """Apply the project's members to MLflow's permissions now (when the tracking server is up); else later."""
    from pipelines.projects import access

    return access.sync_quietly(_platform(), name, removed)


def _airflow_note(name: str, user: str | None, added: bool) -> dict[str, str]:
    """What Airflow does about it (airflow.multi_team on, `auto` once a project besides `default` exists): the
    member's own login, a switch to or from project teams; applied when Airflow next starts (while one runs,
    after `flywheel down && flywheel up`)."""
    from pipelines.clients import airflow
    from pipelines.projects.airflow_access import enabled, login, login_password_file, mode
    from pipelines.stack import airflow as airflow_server

    platform = _platform()
    on, prepared = enabled(platform), airflow_server.multi_team_env_file(platform).is_file()
    if not (on or prepared):  # single-team before and after: nothing to say, no server to ask
        return {}
    if airflow.running(platform):
        later = (
            ": Airflow applies it when restarted (`flywheel down && flywheel up`); until then it serves the "
            "logins, roles and tokens it started with"
        )
        switch = (
            ": until Airflow restarts (`flywheel down && flywheel up`), `flywheel up` and `flywheel run` "
            "refuse while it runs"
        )
    else:
        later = switch = ": from Airflow's next start (`flywheel up`)"
    note: dict[str, str] = {}
    if on and not prepared:
        note["airflow"] = (
            f"Airflow turns multi-team (airflow.multi_team: {mode(platform)}): each project an Airflow "
            f"team whose DAGs only its members see{switch}"
        )
    elif not on and prepared:
        why = "no project besides `default` is left" if mode(platform) == "auto" else "airflow.multi_team: false"
        note["airflow"] = f"Airflow turns single-team again ({why}){switch}"
    elif user is None and on:  # the project's team and bundle go with it
        note["airflow"] = f"{name}'s team, DAGs and logins removed{later}"
    if user is not None and user != "admin" and on:
        who = login(user, name)
        note["airflow_login"] = (
            f"{who}, password in {login_password_file(platform, who)}" if added else f"{who} removed"
        ) + later
    return note


@project_app.command("create")
def create_cmd(
    name: NameArg,
    owner: Annotated[str | None, typer.Option(help="its first owner (default: you)")] = None,
    rpm: RpmOpt = None,
    tokens_per_day: TokensOpt = None,
    training_runs: RunsOpt = None,
    concurrent: ConcurrentOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a project: its zones, experiment, registered model and DAGs appear as it is used."""
    from pipelines.projects import registry

    quotas = registry.Quotas(
        rpm=rpm, tokens_per_day=tokens_per_day, training_runs=training_runs or 1, concurrent=concurrent
    )
    try:
        project = registry.create(_platform(), name, owner or _user(), quotas)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    emit(
        {**project.summary(), "access": _sync_access(name), **_airflow_note(name, project.owner, True)},
        as_json,
        f"project {name} created",
    )


@project_app.command("list")
def list_cmd(as_json: JsonOpt = False) -> None:
    """Every project with its owner, members, active keys and quotas."""
    from pipelines.projects import registry

    projects = registry.load(_platform())
    if as_json:
        sys.stdout.write(
            __import__("json").dumps({"projects": [p.summary() for p in projects.values()]}, indent=2) + "\n"
        )
        return
    print_table(
        "projects",
        ("project", "owner", "members", "active keys", "rpm", "tokens/day", "training runs"),
        [
            [
                p.name,
                p.owner,
                str(len(p.members)),
                str(len(p.active_keys())),
                str(p.quotas.rpm or "-"),
                str(p.quotas.tokens_per_day or "-"),
                str(p.quotas.training_runs),
            ]
            for p in projects.values()
        ],
    )


@project_app.command("show")
def show_cmd(name: NameArg, as_json: JsonOpt = False) -> None:
    """A project: members, keys (ids only), quotas, and where its data, experiment, model and DAG live."""
    from pipelines.airflow_tasks import dag_id_for
    from pipelines.projects import registry, settings_for
    from pipelines.serve import deploy

    platform = _platform()
    try:
        project = registry.get(platform, name)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    scoped = settings_for(platform, name)
    live = deploy.state(scoped).get("live")
    emit(
        {
            **project.summary(),
            "root": scoped.project_root(),
            "experiment": scoped.mlflow.experiment,
            "registered_model": scoped.mlflow.registered_model,
            "feast_project": scoped.feast.project,
            "triton_models": f"{scoped.triton.model_name}_v<N>",
            "dags": [dag_id_for("commerce_flywheel", name), dag_id_for("drift_monitor", name)],
            "champion": live["name"] if live else None,
        },
        as_json,
        f"project {name}",
    )


@project_app.command("members")
def members_cmd(
    name: NameArg,
    action: Annotated[str, typer.Argument(help="add or remove")],
    user: Annotated[str, typer.Argument(help="the user (their MLflow user name)")],
    role: Annotated[str, typer.Option(help="viewer, editor or owner")] = "viewer",
    as_json: JsonOpt = False,
) -> None:
    """Add a member with a role (or change their role), or remove one; MLflow's permissions follow."""
    from pipelines.projects import registry

    if action not in ("add", "remove"):
        raise UserError(f"members: expected add or remove, got {action!r}")
    try:
        if action == "add":
            project = registry.set_member(_platform(), name, user, role)
        else:
            project = registry.remove_member(_platform(), name, user)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    access = _sync_access(name, (user,) if action == "remove" else ())
    out = {"project": name, "members": project.members, "access": access, **_airflow_note(name, user, action == "add")}
    emit(out, as_json, f"project {name}")


@project_app.command("quota")
def quota_cmd(
    name: NameArg,
    rpm: Annotated[int | None, typer.Option("--rpm", min=0, help="requests per minute (0: no limit)")] = None,
    tokens_per_day: Annotated[
        int | None, typer.Option("--tokens-per-day", min=0, help="tokens per UTC day (0: no limit)")
    ] = None,
    training_runs: RunsOpt = None,
    concurrent: Annotated[
        int | None, typer.Option("--concurrent", min=0, help="requests in flight at once (0: no limit)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Set a project's quotas (only the options given change; 0 lifts a gateway limit)."""
    from pipelines.projects import registry

    values = {
        k: (v or None)
        for k, v in (("rpm", rpm), ("tokens_per_day", tokens_per_day), ("concurrent", concurrent))
        if v is not None
    }  # 0: no limit
    if training_runs is not None:
        values["training_runs"] = training_runs
    if not values:
        raise UserError("quota: give --rpm, --tokens-per-day, --training-runs or --concurrent")
    try:
        project = registry.set_quotas(_platform(), name, **values)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    emit({"project": name, "quotas": project.quotas.model_dump()}, as_json, f"project {name} quotas")


@project_app.command("tune")
def tune_cmd(
    name: NameArg,
    method: Annotated[
        str,
        typer.Option(
            "--method",
            help="off, dpo, kto or grpo: the tune stage after this project's SFT sweeps; platform: tune.method",
        ),
    ],
    as_json: JsonOpt = False,
) -> None:
    """Choose a project's tuning after SFT (the DAG's tune task); `--method platform` follows `tune.method`."""
    from pipelines.config.tune import TUNE_METHODS
    from pipelines.projects import registry

    if method not in (*TUNE_METHODS, "platform"):
        raise UserError(f"--method: expected one of {', '.join((*TUNE_METHODS, 'platform'))}, got {method!r}")
    try:
        project = registry.set_tune_method(_platform(), name, None if method == "platform" else method)  # type: ignore[arg-type]
    except _errors() as exc:
        raise UserError(str(exc)) from None
    emit({"project": name, "tune_method": project.tune_method or "platform"}, as_json, f"project {name} tuning")


@project_app.command("usage")
def usage_cmd(
    name: NameArg,
    since: Annotated[str | None, typer.Option(help="first day, YYYY-MM-DD (default: 30 days ago)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Showback: training compute, serving tokens and compute, storage, priced; an HTML and a JSON report."""
    from datetime import date, timedelta

    from pipelines.cli.common import parse_date
    from pipelines.projects import registry, settings_for, showback

    first = parse_date(since, "--since") if since else date.today() - timedelta(days=30)
    try:
        registry.get(_platform(), name)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    with console.status(f"reading {name}'s usage ..."):
        data = showback.report(settings_for(_platform(), name), first)
    if as_json:
        sys.stdout.write(__import__("json").dumps(data, indent=2) + "\n")
        return
    print_table(
        f"project {name} since {data['since']}",
        ("what", "amount", "USD"),
        [
            [
                "training",
                f"{data['training']['runs']} runs, {data['training']['device_seconds']:,} device-s",
                f"{data['training']['usd']:.4f}",
            ],
            [
                "serving",
                f"{data['serving']['requests']} requests, {data['serving']['tokens']:,} tokens, "
                f"{data['serving']['compute_seconds']:,} s",
                f"{data['serving']['usd']:.4f}",
            ],
            ["storage", f"{data['storage']['bytes']:,} bytes", "-"],
            ["total", "", f"{data['total_usd']:.4f}"],
        ],
    )
    console.print(f"report: {data['html_uri']}")


@project_app.command("delete")
def delete_cmd(name: NameArg, as_json: JsonOpt = False) -> None:
    """Delete a project that serves no traffic (its keys stop at once; its data is kept under projects/_deleted)."""
    from pipelines.projects import access, registry

    try:
        result = registry.delete(_platform(), name)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    result["mlflow"] = access.revoke_quietly(_platform(), name, tuple(result["members"]))
    emit({**result, **_airflow_note(name, None, False)}, as_json, f"project {name} deleted")


@key_app.command("create")
def key_create_cmd(name: NameArg, as_json: JsonOpt = False) -> None:
    """A new gateway key for the project, printed once (only its hash is kept)."""
    from pipelines.projects import registry

    try:
        key_id, key = registry.create_key(_platform(), name)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    if as_json:
        sys.stdout.write(__import__("json").dumps({"project": name, "key": key, "id": key_id}) + "\n")
        return
    sys.stdout.write(f"{key}\n")
    console.print(f"key {key_id} for project {name}: shown once, keep it in your secret store")


@key_app.command("revoke")
def key_revoke_cmd(
    name: NameArg,
    key_id: Annotated[str | None, typer.Argument(help="the key's id")] = None,
    all_keys: Annotated[bool, typer.Option("--all", help="revoke every active key")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key (by the id `project show` lists) or --all: the gateway refuses it at once."""
    from pipelines.projects import registry

    if (key_id is None) == (not all_keys):
        raise UserError("key revoke: give a key id or --all (not both)")
    try:
        revoked = registry.revoke_key(_platform(), name, key_id)
    except _errors() as exc:
        raise UserError(str(exc)) from None
    emit({"project": name, "revoked": revoked}, as_json, f"project {name}")
