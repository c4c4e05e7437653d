"""Airflow access per AI project, enforced by Airflow itself: Airflow 3.3's multi-team mode with its simple auth
manager (`airflow.multi_team`, `auto` by default: on while the platform has a project besides `default`, so a
single-team platform runs Airflow as before; multi-team is an experimental feature of Airflow 3.3).

Each project (and `default`) is an Airflow team that owns one DAG bundle, `<airflow home>/bundles/<project>/`:
copies of the repository's DAG files fixed to that project (their `BUNDLE_PROJECT` line), so the bundle holds
that project's DAGs only (`commerce_flywheel__<project>`, `drift_monitor__<project>`) and Airflow knows each
DAG's team from its bundle. A member gets one Airflow login per project, `<user>@<project>`, on that team only:
Airflow's simple auth manager holds ONE role per login, and a member's roles differ between projects. The role
is the project role's: viewer -> Airflow `viewer` (reads the team's DAGs and runs), editor and owner -> `user`
(also triggers, clears, pauses them). Another team's DAG is a 403 and is left out of the DAG and run lists;
`admin` sees all. Each login's password is generated here into `<root>/runs/users/<login>.airflow.password`
(0600) and into Airflow's password file (kept 0600), so Airflow generates and prints none.

Airflow's servers read the teams, bundles and logins when they start: `prepare` (at `flywheel up` and before
each `flywheel run`) refuses while a running Airflow holds an older set (a new project, a changed member):
`flywheel down && flywheel up` applies it, with a new token-signing secret so that no token issued before
(carrying its login's old role and teams) is accepted after.

Leaving multi-team mode (`false`, or `auto` once the last project besides `default` is deleted) is the same:
refused while the running Airflow serves the teams, else the teams' bundles, logins and their passwords go, and
the next Airflow parses the DAG folder again as one bundle.

Why not FAB: FAB's per-DAG `access_control` needs the FAB provider (flask-appbuilder and its stack) and a user
database beside the one the platform already runs; Airflow 3.3's own teams express "a project's runs are
visible and triggerable only by its members" with the auth manager the platform runs.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pipelines.config import DEFAULT_PROJECT, Settings

BUNDLE_LINE = re.compile(r"^BUNDLE_PROJECT: str \| None = None\b.*$", re.MULTILINE)
AIRFLOW_ROLE = {"viewer": "viewer", "editor": "user", "owner": "user"}
PREPARE_TIMEOUT_S = 900.0
SECRET_KEY = "AIRFLOW__API_AUTH__JWT_SECRET"  # noqa: S105 (a name, not a secret)


def enabled(settings: Settings, projects: Iterable[str] | None = None) -> bool:
    """Whether Airflow runs in multi-team mode for this platform: `airflow.multi_team`, where `auto` is on while
    the registry (or `projects`, its names as read already) holds a project besides `default`."""
    from pipelines.projects import registry

    mode = settings.airflow.multi_team
    if mode != "auto":
        return bool(mode)
    return any(name != DEFAULT_PROJECT for name in (registry.load(settings) if projects is None else projects))


def team_name(project: str) -> str:
    """The project's Airflow team: its name, a two-character one padded with `-` (teams need three characters;
    no project name holds a `-`, so no two projects ever share a team)."""
    return project.ljust(3, "-")


def login(user: str, project: str) -> str:
    return f"{user}@{project}"


def bundle_name(project: str) -> str:
    return f"project-{project}"


def bundle_dir(settings: Settings, project: str) -> Path:
    return Path(str(settings.airflow.home)) / "bundles" / project


def login_password_file(settings: Settings, name: str) -> Path:
    return Path(str(settings.root)) / "runs" / "users" / f"{name}.airflow.password"


def write_bundles(settings: Settings, projects: list[str]) -> None:
    """Each project's bundle folder (a file rewritten only when its text changed: the DAG processor re-parses
    what changed), a deleted project's folder removed."""
    from pipelines.storage import write_text

    source = Path(settings.airflow.dags_folder)
    files = sorted(source.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no DAG files in {source} (airflow.dags_folder)")
    for project in projects:
        folder = bundle_dir(settings, project)
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            text, n = BUNDLE_LINE.subn(
                f"BUNDLE_PROJECT: str | None = {project!r}  # this bundle's project (written "
                "by flywheel: pipelines/projects/airflow_access.py)",
                f.read_text(),
            )
            if n != 1:
                raise ValueError(
                    f"{f} has no `BUNDLE_PROJECT: str | None = None` line: it cannot be bundled per project"
                )
            target = folder / f.name
            if not target.is_file() or target.read_text() != text:
                write_text(str(target), text)
    for gone in bundle_dir(settings, DEFAULT_PROJECT).parent.iterdir():
        if gone.is_dir() and gone.name not in projects:
            shutil.rmtree(gone)


def bundle_config(settings: Settings, projects: list[str]) -> list[dict[str, Any]]:
    """Airflow's `dag_bundle_config_list` for these projects' bundles."""
    return [
        {
            "name": bundle_name(p),
            "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
            "kwargs": {"path": str(bundle_dir(settings, p))},
            "team_name": team_name(p),
        }
        for p in projects
    ]


def logins(projects: Mapping[str, Any]) -> dict[str, str]:
    """login -> `role:team` for every member of every project (the registry as read already; the platform's
    `admin` has its own login)."""
    return {
        login(user, name): f"{AIRFLOW_ROLE[role]}:{team_name(name)}"
        for name, project in sorted(projects.items())
        for user, role in sorted(project.members.items())
        if user != "admin"
    }


def _passwords(settings: Settings, wanted: list[str]) -> None:
    """A password for each login in Airflow's password file (0600; under Airflow's own lock on it) and in the
    login's own file (0600); a login no longer wanted loses both."""
    import fcntl

    from pipelines.clients import airflow

    path = airflow.password_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.chmod(path, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # what SimpleAuthManager.init takes before it writes the file
        try:
            known = json.loads(fh.read().strip() or "{}")
            for name in [n for n in known if "@" in n and n not in wanted]:
                del known[name]
                login_password_file(settings, name).unlink(missing_ok=True)
            for name in wanted:
                known.setdefault(name, secrets.token_urlsafe(24))
                own = login_password_file(settings, name)
                if not own.is_file() or own.read_text().strip() != known[name]:
                    own.parent.mkdir(parents=True, exist_ok=True)
                    own.touch(mode=0o600)
                    own.chmod(0o600)
                    own.write_text(known[name] + "\n")
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(known) + "\n")
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def prepare(settings: Settings) -> dict[str, str]:
    """In multi-team mode (nothing when it is off): each project's bundle, team and logins, under a lock.
    What every Airflow process of the platform then reads (`airflow_env`, from `airflow_server.multi_team_env_file`,
    0600) is written only after the metadata DB is migrated and the teams exist, and only while no Airflow
    server runs with an older set (refused with the command that applies it). Unchanged: nothing to do."""
    from filelock import FileLock

    from pipelines.clients import airflow
    from pipelines.projects import registry
    from pipelines.stack import airflow as airflow_server
    from pipelines.storage import write_json

    home = Path(str(settings.airflow.home))
    env_file = airflow_server.multi_team_env_file(settings)
    if not env_file.is_file() and not enabled(settings):  # the registry read only without teams in place
        return {}  # single-team, as it was
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(str(home / "flywheel-multi-team.lock"), timeout=PREPARE_TIMEOUT_S):
        registered = registry.load(settings)  # read once, under the lock: a project may have come or gone
        if not enabled(settings, registered):
            if env_file.is_file():
                _leave(settings, env_file)
            return {}
        old = json.loads(env_file.read_text()) if env_file.is_file() else {}
        users, projects = logins(registered), sorted(registered)
        out = {
            "AIRFLOW__CORE__MULTI_TEAM": "True",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundle_config(settings, projects)),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(
                ["admin:admin", *(f"{n}:{r}" for n, r in users.items())]
            ),
        }
        if {k: v for k, v in old.items() if k != SECRET_KEY} == out:
            write_bundles(settings, projects)  # the same set: the DAG files' copies follow the repository's
            return old
        if airflow.running(settings):
            auto = settings.airflow.multi_team == "auto"
            raise airflow.AirflowUnavailable(
                (
                    "the running Airflow serves an older set of project teams, DAG bundles or logins (a project or "
                    "member "
                    "changed since it started)"
                    if old
                    else f"Airflow is to keep each project's DAGs to its members (airflow.multi_team: {mode(settings)}"
                    f"{', and the platform has projects besides `default`' if auto else ''}), and the running Airflow "
                    "started without teams"
                )
                + ": apply it with `flywheel down && flywheel up`"
                + (" (or keep Airflow single-team: FLYWHEEL_AIRFLOW__MULTI_TEAM=false)" if auto and not old else "")
            )
        with airflow_server.layout(settings, switch=not old):  # from one DAG-folder bundle to teams: no run under it
            write_bundles(settings, projects)
            out[SECRET_KEY] = secrets.token_urlsafe(32)  # tokens issued before (old roles and teams) stop working
            _passwords(settings, list(users))
            for args in (("db", "migrate"), ("teams", "sync")):
                done = airflow_server.run_cli(
                    settings, *args, timeout=settings.airflow.migrate_timeout_s, extra_env=out
                )
                if done.returncode != 0:
                    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
                    raise airflow.AirflowUnavailable(
                        f"`airflow {' '.join(args)}` failed for the project teams: {tail[0]}"
                    )
            write_json(str(env_file), out)
            env_file.chmod(0o600)
        return out


def _leave(settings: Settings, env_file: Path) -> None:
    """Back to single-team (under prepare's lock): refused while an Airflow started with the teams runs (its
    processes would keep them); else the bundles, the member logins with their passwords and the teams' file go."""
    from pipelines.clients import airflow
    from pipelines.stack import airflow as airflow_server

    if airflow.running(settings):
        raise airflow.AirflowUnavailable(
            "the running Airflow keeps each project's DAGs to its members (multi-team), which is now off "
            f"(airflow.multi_team: {mode(settings)}"
            f"{', and no project besides `default` is left' if settings.airflow.multi_team == 'auto' else ''}"
            "): apply it with `flywheel down && flywheel up`"
        )
    with airflow_server.layout(settings, switch=True):  # no run under it
        if airflow.password_file(settings).is_file():
            _passwords(settings, [])  # the member logins; admin's stays
        for own in login_password_file(settings, "*@*").parent.glob("*@*.airflow.password"):
            own.unlink(missing_ok=True)
        env_file.unlink()  # single-team from here (the file says the layout): what is left below is unused
        shutil.rmtree(bundle_dir(settings, DEFAULT_PROJECT).parent, ignore_errors=True)


def mode(settings: Settings) -> str:
    """`airflow.multi_team` as it is written: true, false or auto."""
    value = settings.airflow.multi_team
    return value if isinstance(value, str) else str(value).lower()
