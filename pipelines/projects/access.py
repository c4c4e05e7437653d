"""A project's members in MLflow's own permissions (the tracking server's basic-auth app), so MLflow itself
refuses what a role does not allow: a viewer of project A reads A's experiment and registered model and
nothing of B's (the server's `default_permission` is NO_PERMISSIONS: mlflow/basic_auth.ini), an editor
writes A's, an owner manages A's.

Each member becomes an MLflow user (created once, its password generated into a 0600 file under
<root>/runs/users/, as the admin's is); grants go through MLflow's REST API as the admin: experiment (by
id) and registered model (by name), READ / EDIT / MANAGE for viewer / editor / owner.

Access converges: every `sync` computes the grants the member list wants and revokes every other user's grant
on the project's experiment and model (whoever was removed while the server was down, or after a failed
call), revokes first, then grants, every call tried even when one fails (the failures raised together at the
end). `sync` runs after every membership change when the tracking server is up, and for every project at
`flywheel up`.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

from pipelines.config import Settings

LOG = logging.getLogger("flywheel.projects")
PERMISSION = {"viewer": "READ", "editor": "EDIT", "owner": "MANAGE"}
TIMEOUT_S = 10.0


class AccessError(RuntimeError):
    """MLflow refused or could not be reached; the message says which call and why."""


def password_file(settings: Settings, user: str) -> Path:
    """Where a member's generated MLflow password is kept (0600): beside the admin's locally; on a cluster
    (object-store root) in ~/.flywheel/users of the operator's machine, to be put into the team's secret store."""
    base = Path(str(settings.root)) / "runs" if settings.is_local else Path.home() / ".flywheel"
    return base / "users" / f"{user}.password"


class MlflowAuth:
    """The few auth-app calls we need, as MLflow's admin (basic auth), each with a timeout."""

    def __init__(self, settings: Settings) -> None:
        import httpx

        from pipelines.clients import mlflow as mlflow_client

        self.url = mlflow_client.server_url(settings)
        self.http = httpx.Client(
            base_url=self.url, timeout=TIMEOUT_S, auth=(mlflow_client.ADMIN, mlflow_client.admin_password(settings))
        )

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AccessError(f"MLflow at {self.url} did not answer {path} ({type(exc).__name__})") from None
        if response.status_code >= 400:
            raise AccessError(f"MLflow refused {path}: HTTP {response.status_code} {response.text[:200]}")
        return response.json() if response.content else {}

    def user_exists(self, user: str) -> bool:
        try:
            self._call("GET", "/api/2.0/mlflow/users/get", params={"username": user})
            return True
        except AccessError as exc:
            if "HTTP 404" in str(exc) or "RESOURCE_DOES_NOT_EXIST" in str(exc):
                return False
            raise

    def users(self) -> list[str]:
        """Every user the tracking server knows (the auth app's list)."""
        return [str(u["username"]) for u in self._call("GET", "/api/2.0/mlflow/users/list").get("users", [])]

    def create_user(self, user: str, password: str) -> None:
        self._call("POST", "/api/2.0/mlflow/users/create", json={"username": user, "password": password})

    def grant(self, user: str, kind: str, resource: str, permission: str) -> None:
        """Set `user`'s permission on one resource (a revoke first: MLflow refuses a second grant)."""
        self.revoke(user, kind, resource)
        self._call(
            "POST",
            "/api/3.0/mlflow/users/permissions/grant",
            json={"username": user, "resource_type": kind, "resource_id": resource, "permission": permission},
        )

    def revoke(self, user: str, kind: str, resource: str) -> None:
        try:
            self._call(
                "POST",
                "/api/3.0/mlflow/users/permissions/revoke",
                json={"username": user, "resource_type": kind, "resource_id": resource},
            )
        except AccessError as exc:
            if "HTTP 404" not in str(exc) and "RESOURCE_DOES_NOT_EXIST" not in str(exc):
                raise


def _ensure_user(auth: MlflowAuth, settings: Settings, user: str) -> str | None:
    """Create the MLflow user once; its password goes to a 0600 file (returned), never to a log."""
    from pipelines.storage import write_text

    if auth.user_exists(user):
        return None
    file = password_file(settings, user)
    if not file.is_file():
        write_text(str(file), secrets.token_urlsafe(24))  # atomic, 0600 (mkstemp)
    auth.create_user(user, file.read_text().strip())
    return str(file)


def sync(settings: Settings, name: str, removed: tuple[str, ...] = ()) -> dict[str, Any]:
    """Make MLflow's grants on project `name`'s experiment and registered model exactly its members': every
    other user's grant there is revoked (`removed` is only a hint: a user MLflow knows but the members do not
    name loses access whoever removed them, and when). `settings`: the platform's (unscoped)."""
    from pipelines.clients import mlflow as mlflow_client
    from pipelines.projects import registry, settings_for

    project = registry.get(settings, name)
    scoped = settings_for(settings, name)
    experiment_id = mlflow_client.use_tracking(scoped)  # created on first use, where the tasks would
    model = scoped.mlflow.registered_model
    wanted = {u: PERMISSION[r] for u, r in project.members.items() if u != mlflow_client.ADMIN}
    auth = MlflowAuth(settings)
    created: dict[str, str] = {}
    failures: list[str] = []
    try:
        others = sorted((set(auth.users()) | set(removed)) - set(wanted) - {mlflow_client.ADMIN})
        for user in others:  # revokes first: a grant that fails never leaves a removed member in
            _try(failures, f"revoke {user}", lambda u=user: _revoke_both(auth, u, experiment_id, model))
        for user, permission in sorted(wanted.items()):
            _try(
                failures,
                f"grant {user}",
                lambda u=user, p=permission: _grant_both(auth, settings, u, p, experiment_id, model, created),
            )
    finally:
        auth.close()
    if failures:
        raise AccessError(f"project {name}: {len(failures)} MLflow permission call(s) failed: {'; '.join(failures)}")
    return {"experiment_id": experiment_id, "registered_model": model, "grants": wanted, "new_users": created}


def _try(failures: list[str], what: str, call: Any) -> None:
    try:
        call()
    except AccessError as exc:
        failures.append(f"{what}: {exc}")


def _revoke_both(auth: MlflowAuth, user: str, experiment_id: str, model: str) -> None:
    auth.revoke(user, "experiment", experiment_id)
    auth.revoke(user, "registered_model", model)


def _grant_both(
    auth: MlflowAuth, settings: Settings, user: str, permission: str, experiment_id: str, model: str, created: dict
) -> None:
    file = _ensure_user(auth, settings, user)
    if file:
        created[user] = file
    auth.grant(user, "experiment", experiment_id, permission)
    auth.grant(user, "registered_model", model, permission)


def sync_quietly(settings: Settings, name: str, removed: tuple[str, ...] = ()) -> str:
    """`sync` when the tracking server is up (one line saying what happened); else when it next starts."""
    from pipelines import services
    from pipelines.clients import mlflow as mlflow_client

    if not settings.mlflow.auth:
        return "MLflow runs without authentication (mlflow.auth off): no permissions to set"
    url = mlflow_client.server_url(settings)
    row = (
        services.status(str(settings.root), "mlflow", f"{url}/health", url).to_dict()
        if settings.is_local
        else {"healthy": True}
    )
    if not row.get("healthy"):
        return "MLflow permissions: applied when the tracking server starts (`flywheel up`)"
    try:
        done = sync(settings, name, removed)
    except Exception as exc:  # noqa: BLE001 (MLflow's own errors too: the membership is recorded either way)
        from pipelines.errors import one_line

        return f"MLflow permissions not applied: {one_line(exc)} (`flywheel up` retries)"
    new = f"; new MLflow users' passwords: {', '.join(done['new_users'].values())}" if done["new_users"] else ""
    return f"MLflow permissions set on experiment {done['experiment_id']} and {done['registered_model']}{new}"


def sync_all(settings: Settings) -> dict[str, str]:
    """Every project's grants, `default` included (at `flywheel up`, once the tracking server answers), and
    the grants of deleted projects' members revoked."""
    from pipelines.projects import registry

    out = {name: sync_quietly(settings, name) for name in registry.load(settings)}
    for name, gone in registry.deleted(settings).items():
        out[f"{name} (deleted)"] = revoke_quietly(settings, name, tuple(gone.get("members", ())))
    return out


def revoke_quietly(settings: Settings, name: str, users: tuple[str, ...]) -> str:
    """Revoke `users`' grants on project `name`'s experiment and model (a deleted project's members)."""
    from pipelines.clients import mlflow as mlflow_client
    from pipelines.errors import one_line
    from pipelines.projects import settings_for

    if not settings.mlflow.auth or not users:
        return "nothing to revoke"
    scoped = settings_for(settings, name)
    try:
        experiment_id = mlflow_client.use_tracking(scoped)
        auth = MlflowAuth(settings)
        try:  # every user MLflow knows, not only the members the deletion recorded: nothing is left behind
            for user in sorted((set(auth.users()) | set(users)) - {mlflow_client.ADMIN}):
                _revoke_both(auth, user, experiment_id, scoped.mlflow.registered_model)
        finally:
            auth.close()
    except Exception as exc:  # noqa: BLE001 (retried at the next `flywheel up`)
        return f"grants not revoked: {one_line(exc)} (`flywheel up` retries)"
    return f"grants of {', '.join(users)} revoked"
