"""The project list: one JSON state file at <root>/projects/registry.json, changed only under its lock and
written atomically (storage.write_json), so two commands never lose each other's change.

A project: its members with a role (viewer < editor < owner), its gateway keys (only a SHA-256 of each key
is kept: the key itself is shown once, at creation), and its quotas. `default` always exists: the
single-team layout, today's flow, with the gateway's own key (`gateway.api_key`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from pipelines.config import DEFAULT_PROJECT, PROJECT_PATTERN, Settings, load_settings
from pipelines.config.tune import TuneMethod

Role = Literal["viewer", "editor", "owner"]
ROLES: tuple[str, ...] = ("viewer", "editor", "owner")
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
KEY_PREFIX = "fwp-"
LOCK_TIMEOUT_S = 30.0


class ProjectError(ValueError):
    """A project command that cannot be done as asked (unknown project, bad name, not a member, ...): one line."""


class Quotas(BaseModel):
    rpm: int | None = Field(default=None, ge=1, description="gateway requests per minute (None: no limit)")
    tokens_per_day: int | None = Field(
        default=None, ge=1, description="gateway tokens (prompt + completion) per UTC day"
    )
    training_runs: int = Field(default=1, ge=1, le=64, description="concurrent training runs (its DAG's active runs)")
    concurrent: int | None = Field(
        default=None,
        ge=1,
        description="gateway completions in flight at once for the project "
        "(None: up to the gateway's own limit, gateway.max_concurrent_requests)",
    )


class ApiKey(BaseModel):
    id: str
    sha256: str
    created_at: str
    revoked_at: str | None = None


class Project(BaseModel):
    name: str
    created_at: str
    owner: str
    members: dict[str, Role] = Field(default_factory=dict)
    keys: list[ApiKey] = Field(default_factory=list)
    quotas: Quotas = Field(default_factory=Quotas)
    # the project's tuning after SFT (`flywheel project tune`); None: the platform's `tune.method`
    tune_method: TuneMethod | None = None

    def active_keys(self) -> list[ApiKey]:
        return [k for k in self.keys if k.revoked_at is None]

    def summary(self) -> dict[str, Any]:
        """What `project show` prints: never a key's hash."""
        return {
            "name": self.name,
            "created_at": self.created_at,
            "owner": self.owner,
            "members": self.members,
            "keys": [{"id": k.id, "created_at": k.created_at, "revoked_at": k.revoked_at} for k in self.keys],
            "quotas": self.quotas.model_dump(),
            "tune_method": self.tune_method,
        }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def registry_uri(settings: Settings) -> str:
    return f"{str(settings.root).rstrip('/')}/projects/registry.json"


def check_name(name: str) -> str:
    if not re.fullmatch(PROJECT_PATTERN, name or ""):
        raise ProjectError(
            f"project name {name!r}: 2-31 characters, lower-case letters, digits and _, starting "
            "with a letter (it names a folder, an S3 prefix, a Feast project and Triton models)"
        )
    return name


def check_user(user: str) -> str:
    if not re.fullmatch(USER_PATTERN, user or ""):
        raise ProjectError(f"user {user!r}: 1-64 characters, letters, digits and _ . @ -")
    return user


def _read(settings: Settings) -> dict[str, Any]:
    from pipelines.storage import exists, read_json

    uri = registry_uri(settings)
    return read_json(uri) if exists(uri) else {}


def deleted(settings: Settings) -> dict[str, dict[str, Any]]:
    """Deleted projects by name: when, who its members were, where its data was kept. A deleted name is never
    given to a new project (its MLflow experiment and registered model stay, with their history)."""
    return dict(_read(settings).get("deleted") or {})


def load(settings: Settings) -> dict[str, Project]:
    """Every project by name (`default` included, created implicitly)."""
    found = _read(settings).get("projects") or {}
    projects = {name: Project.model_validate(data) for name, data in found.items()}
    projects.setdefault(
        DEFAULT_PROJECT, Project(name=DEFAULT_PROJECT, created_at="", owner="admin", members={"admin": "owner"})
    )
    return projects


def get(settings: Settings, name: str) -> Project:
    projects = load(settings)
    if name not in projects:
        check_name(name)
        raise ProjectError(
            f"unknown project {name!r} (`flywheel project list` names them; `flywheel project create {name}` makes it)"
        )
    return projects[name]


def _change(
    settings: Settings,
    change: Callable[[dict[str, Project]], Any],
    tombstones: Callable[[dict[str, Any]], None] | None = None,
) -> Any:
    """Read, change and write the registry under its lock (atomic write: readers see all of it or none). On
    object storage the lock holds across hosts (`pipelines.locks`: an advisory lock on `state_lock_uri`)."""
    from pipelines.locks import shared_lock
    from pipelines.storage import write_json

    uri = registry_uri(settings)
    with shared_lock(uri, LOCK_TIMEOUT_S, "the project registry", settings.state_lock_uri):
        projects, gone = load(settings), deleted(settings)
        result = change(projects)
        if tombstones is not None:
            tombstones(gone)
        write_json(uri, {"version": 1, "projects": {n: p.model_dump() for n, p in projects.items()}, "deleted": gone})
    return result


def create(settings: Settings, name: str, owner: str, quotas: Quotas | None = None) -> Project:
    check_name(name)
    check_user(owner)

    def add(projects: dict[str, Project]) -> Project:
        if name in projects:
            raise ProjectError(f"project {name!r} exists already")
        if name in deleted(settings):
            raise ProjectError(f"project {name!r} was deleted; its name stays with its MLflow history (choose another)")
        projects[name] = Project(
            name=name, created_at=_now(), owner=owner, members={owner: "owner"}, quotas=quotas or Quotas()
        )
        return projects[name]

    return _change(settings, add)


def _existing(projects: dict[str, Project], name: str) -> Project:
    if name not in projects:
        check_name(name)
        raise ProjectError(f"unknown project {name!r} (`flywheel project list` names them)")
    return projects[name]


def set_member(settings: Settings, name: str, user: str, role: str) -> Project:
    check_user(user)
    if role not in ROLES:
        raise ProjectError(f"role {role!r}: one of {', '.join(ROLES)}")

    def put(projects: dict[str, Project]) -> Project:
        project = _existing(projects, name)
        if project.members.get(user) == "owner" and role != "owner" and _owners(project) == [user]:
            raise ProjectError(f"{user} is the only owner of {name}: add another owner first")
        project.members[user] = role  # type: ignore[assignment]
        return project

    return _change(settings, put)


def _owners(project: Project) -> list[str]:
    return [u for u, r in project.members.items() if r == "owner"]


def remove_member(settings: Settings, name: str, user: str) -> Project:
    def drop(projects: dict[str, Project]) -> Project:
        project = _existing(projects, name)
        if user not in project.members:
            raise ProjectError(f"{user!r} is no member of {name} (members: {', '.join(sorted(project.members))})")
        if _owners(project) == [user]:
            raise ProjectError(f"{user} is the only owner of {name}: add another owner first")
        del project.members[user]
        return project

    return _change(settings, drop)


def set_quotas(settings: Settings, name: str, **values: int | None) -> Project:
    def put(projects: dict[str, Project]) -> Project:
        project = _existing(projects, name)
        project.quotas = Quotas.model_validate({**project.quotas.model_dump(), **values})
        return project

    return _change(settings, put)


def set_tune_method(settings: Settings, name: str, method: TuneMethod | None) -> Project:
    """Choose the project's tuning after SFT (None: follow the platform's `tune.method`)."""

    def put(projects: dict[str, Project]) -> Project:
        project = _existing(projects, name)
        project.tune_method = method
        return project

    return _change(settings, put)


def tune_method(settings: Settings) -> TuneMethod:
    """The method the tune stage runs for `settings.project`: the project's own choice, else `tune.method`."""
    if settings.root is None:
        return settings.tune.method
    project = load(settings).get(settings.project)
    return project.tune_method if project is not None and project.tune_method else settings.tune.method


def key_digest(key: str) -> str:
    """What is kept of a key: its SHA-256 (the keys are 256 random bits: no dictionary to try them against)."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(settings: Settings, name: str) -> tuple[str, str]:
    """A new gateway key for the project: (its id, the key). The key is returned once and never stored."""
    key = f"{KEY_PREFIX}{secrets.token_urlsafe(32)}"
    digest = key_digest(key)

    def add(projects: dict[str, Project]) -> str:
        project = _existing(projects, name)
        if name == DEFAULT_PROJECT:
            raise ProjectError(
                "the default project's key is the gateway's own (`flywheel gateway status` names "
                "its file); create a project for keys of your own"
            )
        key_id = digest[:12]
        project.keys.append(ApiKey(id=key_id, sha256=digest, created_at=_now()))
        return key_id

    return _change(settings, add), key


def revoke_key(settings: Settings, name: str, key_id: str | None) -> list[str]:
    """Revoke one key by id (or every active key with None); the ids revoked."""

    def revoke(projects: dict[str, Project]) -> list[str]:
        project = _existing(projects, name)
        chosen = [k for k in project.active_keys() if key_id is None or k.id == key_id]
        if not chosen:
            raise ProjectError(f"{name} has no active key {key_id!r}" if key_id else f"{name} has no active key")
        for k in chosen:
            k.revoked_at = _now()
        return [k.id for k in chosen]

    return _change(settings, revoke)


def key_index(settings: Settings) -> dict[str, str]:
    """Active key digest -> its project (what the gateway authenticates against)."""
    return {k.sha256: p.name for p in load(settings).values() for k in p.active_keys()}


def delete(settings: Settings, name: str) -> dict[str, Any]:
    """Remove a project that serves nothing: its keys stop at once (the gateway re-reads the registry on the
    next request), its zones move to
    <root>/projects/_deleted/<name>-<time> (kept, never lost; remove them by hand when sure), and its name is
    never given again (a tombstone keeps it, with its MLflow experiment and model). Its members, returned, lose
    their MLflow grants through `access.revoke_quietly` (the CLI does it; `flywheel up` does it for every
    tombstone)."""
    from pipelines.serve import deploy
    from pipelines.storage import exists, move

    if name == DEFAULT_PROJECT:
        raise ProjectError("the default project cannot be deleted")
    get(settings, name)  # an unknown name: one clear error before any lock
    scoped = settings_for(settings, name)
    folder = scoped.project_root()
    kept = f"{str(settings.root).rstrip('/')}/projects/_deleted/{name}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    with deploy.state_lock(scoped):  # no deploy of it starts meanwhile
        live = deploy.state(scoped).get("live")
        if live:
            raise ProjectError(
                f"{name} serves traffic ({live['name']} is its champion): take it out of service "
                f"first (`flywheel --project {name} serve undeploy`)"
            )

        members: list[str] = []

        def drop(projects: dict[str, Project]) -> None:
            _existing(projects, name)
            members.extend(sorted(projects.pop(name).members))  # read under the registry's lock: a member
            # added meanwhile is in the tombstone too (and loses its grants with the others)

        def bury(gone: dict[str, Any]) -> None:
            gone[name] = {"at": _now(), "members": members, "data_kept_at": kept}

        _change(settings, drop, bury)  # first: its keys stop before its data moves
    moved = None
    if exists(folder):
        move(folder, kept)
        moved = kept
    return {"deleted": name, "data_kept_at": moved, "members": members}


def settings_for(settings: Settings, name: str) -> Settings:
    """The same settings scoped to project `name` (its zones and names; the servers stay the platform's)."""
    if name == settings.project:
        return settings
    return load_settings(
        **{**settings.unscoped_dump(), "project": check_name(name) if name != DEFAULT_PROJECT else name}
    )
