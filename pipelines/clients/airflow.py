"""Thin client of Airflow's REST API (v2): a token from the simple auth manager's generated passwords, then pause,
unpause, trigger, poll and describe DAGs. The server's processes (standalone, `airflow dags test`) are
`pipelines.stack.airflow`."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pipelines.config import Settings
from pipelines.errors import NotRetryable

PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"  # noqa: S105 (a name, not a secret)
HEALTH_PATH = "/api/v2/monitor/health"


def base_url(settings: Settings) -> str:
    return f"http://{settings.airflow.host}:{settings.airflow.port}"


def running(settings: Settings) -> bool:
    """Whether an Airflow API server answers this platform's health URL."""
    from pipelines.services import http_ok

    return http_ok(f"{base_url(settings)}{HEALTH_PATH}", timeout=3)


def password_file(settings: Settings) -> Path:
    return Path(str(settings.airflow.home)) / PASSWORD_FILE


class AirflowUnavailable(NotRetryable):
    """The Airflow API server is not running or refused a call; the message says what to do."""


class AirflowRest:
    """The few REST calls the platform needs: token, pause/unpause, trigger, poll, describe (API v2)."""

    def __init__(self, settings: Settings, username: str = "admin") -> None:
        self.url = base_url(settings)
        try:
            passwords = json.loads(password_file(settings).read_text())
        except FileNotFoundError:
            raise AirflowUnavailable(
                f"Airflow is not running for {settings.root} (no {password_file(settings)}): "
                "start it with `flywheel up`"
            ) from None
        self._token = self._post("/auth/token", {"username": username, "password": passwords[username]}, auth=False)[
            "access_token"
        ]

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None, auth: bool = True) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)  # noqa: S310
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self._token}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise AirflowUnavailable(f"Airflow {method} {path}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AirflowUnavailable(
                f"Airflow at {self.url} does not answer ({reason}): is `flywheel up` running?"
            ) from None

    def _post(self, path: str, body: dict[str, Any], auth: bool = True) -> Any:
        return self._request("POST", path, body, auth)

    def unpause(self, dag_id: str) -> None:
        self.set_paused(dag_id, False)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": paused})

    def dag(self, dag_id: str) -> dict[str, Any] | None:
        """The DAG's record (is_paused, timetable, next run), or None while Airflow has not parsed it."""
        try:
            return self._request("GET", f"/api/v2/dags/{dag_id}")
        except AirflowUnavailable as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        run = self._post(f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return str(run["dag_run_id"])

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def dag_runs(self, dag_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """The DAG's runs, newest first (by when they were due to run: a queued run has no start yet)."""
        return self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=-run_after&limit={limit}")["dag_runs"]

    def dags(self) -> list[str]:
        return [d["dag_id"] for d in self._request("GET", "/api/v2/dags")["dags"]]


DAG_APPEAR_S = 90.0  # the DAG processor re-reads the folder every 10 s (AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL)


def trigger_and_wait(rest: AirflowRest, dag_id: str, conf: dict[str, Any], timeout_s: float = 3600) -> dict[str, Any]:
    """Unpause, trigger with `conf`, and poll until the run ends (success or failed). A DAG the processor has not
    parsed yet (a project created a moment ago) is waited for, at most DAG_APPEAR_S."""
    appear_by = time.monotonic() + DAG_APPEAR_S
    while rest.dag(dag_id) is None:
        if time.monotonic() > appear_by:
            raise AirflowUnavailable(
                f"Airflow does not know the DAG {dag_id} after {DAG_APPEAR_S:g} s (is its "
                "project in `flywheel project list`? see the DAG processor's log)"
            )
        time.sleep(2)
    rest.unpause(dag_id)
    run_id = rest.trigger(dag_id, conf)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run = rest.dag_run(dag_id, run_id)
        if run["state"] in ("success", "failed"):
            return {"dag_run_id": run_id, "state": run["state"], "run_type": run.get("run_type")}
        time.sleep(3)
    return {"dag_run_id": run_id, "state": "timeout"}
