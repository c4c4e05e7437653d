"""Airflow access per AI project, enforced by Airflow itself: Airflow 3.3's multi-team mode with its simple auth
manager (opt-in, `airflow.multi_team`: multi-team is an experimental feature of Airflow 3.3).

Each project (and `default`) is an Airflow team that owns one DAG bundle, `<airflow home>/bundles/<project>/`:
copies of the repository's DAG files fixed to that project (their `BUNDLE_PROJECT` line), so the bundle holds
that project's DAGs only (`commerce_flywheel__<project>`, `drift_monitor__<project>`) and Airflow knows each
DAG's team from its bundle. A member gets one Airflow login per project, `<user>@<project>`, on that team only:
Airflow's simple auth manager holds ONE role per login, and a member's roles differ between projects. The role
is the project role's: viewer -> Airflow `viewer` (reads the team's DAGs and runs), editor and owner -> `user`
(also triggers, clears, pauses them). Another team's DAG is a 403 and is left out of every list; `admin` sees
all. Logins and bundles follow the registry at each `flywheel up` and before each `flywheel run` (the servers
read them when they start); a login's password is in Airflow's password file, generated at the API server's
start (`airflow.password_file`).

Why not FAB: FAB's per-DAG `access_control` needs the FAB provider (flask-appbuilder and its stack) and a user
database beside the one the platform already runs; Airflow 3.3's own teams express "a project's runs are
visible and triggerable only by its members" with the auth manager the platform runs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from pipelines.config import DEFAULT_PROJECT, Settings

BUNDLE_LINE = re.compile(r"^BUNDLE_PROJECT: str \| None = None\b.*$", re.MULTILINE)
AIRFLOW_ROLE = {"viewer": "viewer", "editor": "user", "owner": "user"}
TEAM_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{3,50}$")  # Airflow's rule for a team name


def team_name(project: str) -> str:
    """The project's Airflow team: its name (a project name of two characters gets a prefix: teams need three)."""
    return project if TEAM_PATTERN.fullmatch(project) else f"project_{project}"


def login(user: str, project: str) -> str:
    return f"{user}@{project}"


def bundle_dir(settings: Settings, project: str) -> Path:
    return Path(str(settings.airflow.home)) / "bundles" / project


def write_bundles(settings: Settings, projects: list[str]) -> list[dict[str, Any]]:
    """Each project's bundle folder (a file rewritten only when its text changed: the DAG processor re-parses
    what changed), a deleted project's folder removed; Airflow's `dag_bundle_config_list`."""
    source = Path(settings.airflow.dags_folder)
    files = sorted(source.glob("*.py"))
    if not files:
        raise FileNotFoundError(f"no DAG files in {source} (airflow.dags_folder)")
    for project in projects:
        folder = bundle_dir(settings, project)
        folder.mkdir(parents=True, exist_ok=True)
        for f in files:
            text, n = BUNDLE_LINE.subn(f"BUNDLE_PROJECT: str | None = {project!r}  # this bundle's project (written "
                                       "by flywheel: pipelines/projects/airflow_access.py)", f.read_text())
            if n != 1:
                raise ValueError(f"{f} has no `BUNDLE_PROJECT: str | None = None` line: it cannot be bundled per project")
            target = folder / f.name
            if not target.is_file() or target.read_text() != text:
                tmp = target.with_suffix(".py.tmp")
                tmp.write_text(text)
                tmp.replace(target)
    root = bundle_dir(settings, DEFAULT_PROJECT).parent
    for gone in root.iterdir():
        if gone.is_dir() and gone.name not in projects:
            shutil.rmtree(gone)
    return [{"name": f"project-{p}", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
             "kwargs": {"path": str(bundle_dir(settings, p))}, "team_name": team_name(p)} for p in projects]


def users(settings: Settings) -> str:
    """Airflow's `simple_auth_manager_users`: `admin` and one login per member and project."""
    from pipelines.projects import registry

    entries = ["admin:admin"]
    for name, project in sorted(registry.load(settings).items()):
        for user, role in sorted(project.members.items()):
            if user != "admin":  # the platform's administrator has the admin login
                entries.append(f"{login(user, name)}:{AIRFLOW_ROLE[role]}:{team_name(name)}")
    return ",".join(entries)


def env(settings: Settings) -> dict[str, str]:
    """What every Airflow process of the platform needs in multi-team mode: the bundles written, the teams'
    bundle list and the logins (Airflow's own settings, as environment variables)."""
    from pipelines.projects import registry

    bundles = write_bundles(settings, sorted(registry.load(settings)))
    return {"AIRFLOW__CORE__MULTI_TEAM": "True",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users(settings)}


def prepare(settings: Settings) -> dict[str, str]:
    """In multi-team mode (nothing when it is off): `env` written where every Airflow process of the platform
    reads it (`airflow.multi_team_env_file`, through `airflow_env`), the metadata DB migrated and every
    project's team created (Airflow's components and `dags test` refuse a bundle whose team does not exist).
    Called by `flywheel up` and before each `flywheel run`."""
    from pipelines.clients import airflow
    from pipelines.storage import write_json

    if not settings.airflow.multi_team:
        return {}
    out = env(settings)
    write_json(str(airflow.multi_team_env_file(settings)), out)
    for args in (("db", "migrate"), ("teams", "sync")):
        done = airflow.run_cli(settings, *args, timeout=settings.airflow.migrate_timeout_s)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise airflow.AirflowUnavailable(f"`airflow {' '.join(args)}` failed for the project teams: {tail[0]}")
    return out
