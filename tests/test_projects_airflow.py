"""Airflow itself keeps a project's DAGs to its members (`airflow.multi_team`: each project an Airflow team owning
its own DAG bundle, one login per member and project). Against the real API server with the DAGs parsed from
the bundles into its metadata DB (`airflow dags reserialize`)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from helpers import run_flywheel, wait_for
from pipelines.config import load_settings

SHOP = {"commerce_flywheel__shop", "drift_monitor__shop"}
SEARCH = {"commerce_flywheel__search", "drift_monitor__search"}


def _call(url: str, method: str, path: str, token: str | None = None, body: dict[str, Any] | None = None
          ) -> tuple[int, Any]:
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode() if body is not None else None,  # noqa: S310
                                 method=method, headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, ConnectionError, TimeoutError):  # not listening yet
        return 0, None


def test_a_projects_dags_are_listed_read_and_triggered_by_its_members_only(tmp_path: Path) -> None:
    """carol (viewer of shop) lists and reads shop's DAGs only, gets 403 for search's and cannot trigger shop's;
    bob (owner of search) triggers search's and gets 403 triggering shop's; admin sees every project's.
    (Mutations tried: each login given every project's team, carol lists search's DAGs; a viewer mapped to
    Airflow's `user` role, carol's trigger is accepted; the bundle copies not fixed to their project, Airflow
    refuses a DAG id in two bundles; the bundles without their teams, the API server refuses the logins.)"""
    from pipelines.clients import airflow
    from pipelines.projects import airflow_access, registry
    from pipelines.services import free_port, stop_group

    settings = load_settings(root=str(tmp_path), airflow={"multi_team": True, "port": free_port()})
    registry.create(settings, "shop", "alice")
    registry.create(settings, "search", "bob")
    added = run_flywheel("project", "members", "shop", "add", "carol", "--role", "viewer", "--json",
                         env={"FLYWHEEL_ROOT": str(tmp_path), "FLYWHEEL_AIRFLOW__MULTI_TEAM": "true"})
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["airflow_login"].startswith("carol@shop ")  # what carol logs in as
    with pytest.raises(airflow.AirflowUnavailable, match="not prepared"):  # never a process on the default bundle
        airflow.run_cli(settings, "version")
    airflow_access.prepare(settings)
    assert airflow_access.team_name("ab") == "project_ab"  # Airflow's teams need 3 characters, projects 2
    shop_file = airflow_access.bundle_dir(settings, "shop") / "commerce_flywheel.py"
    assert "BUNDLE_PROJECT: str | None = 'shop'" in shop_file.read_text()
    parsed = airflow.run_cli(settings, "dags", "reserialize", timeout=600)  # every bundle into the metadata DB
    assert parsed.returncode == 0, parsed.stderr[-3000:]

    home = Path(str(settings.airflow.home))
    server = subprocess.Popen([str(airflow.bin_dir() / "airflow"), "api-server"], env=airflow.airflow_env(settings),  # noqa: S603
                              cwd=str(home), stdout=(home / "api.log").open("w"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        url = airflow.base_url(settings)
        wait_for(lambda: _call(url, "GET", airflow.HEALTH_PATH)[0] == 200 or server.poll() is not None, 240,
                 "the Airflow API server", interval_s=2)
        assert server.poll() is None, (home / "api.log").read_text()[-3000:]
        passwords = json.loads(airflow.password_file(settings).read_text())
        assert {"admin", "alice@shop", "carol@shop", "bob@search"} <= set(passwords)

        def token(user: str) -> str:
            code, body = _call(url, "POST", "/auth/token", body={"username": user, "password": passwords[user]})
            assert code == 201, (user, code)
            return body["access_token"]

        admin, carol, bob, alice = (token(u) for u in ("admin", "carol@shop", "bob@search", "alice@shop"))
        listed = {u: {d["dag_id"] for d in _call(url, "GET", "/api/v2/dags?limit=100", t)[1]["dags"]}
                  for u, t in (("admin", admin), ("carol", carol), ("bob", bob))}
        assert SHOP | SEARCH | {"commerce_flywheel", "drift_monitor"} <= listed["admin"]
        assert listed["carol"] == SHOP and listed["bob"] == SEARCH
        assert _call(url, "GET", "/api/v2/dags/commerce_flywheel__shop", carol)[0] == 200
        assert _call(url, "GET", "/api/v2/dags/commerce_flywheel__search", carol)[0] == 403
        assert _call(url, "GET", "/api/v2/dags/commerce_flywheel__search/dagRuns", alice)[0] == 403
        run = {"logical_date": None, "conf": {}}
        assert _call(url, "POST", "/api/v2/dags/commerce_flywheel__shop/dagRuns", carol, run)[0] == 403  # a viewer
        assert _call(url, "POST", "/api/v2/dags/commerce_flywheel__shop/dagRuns", bob, run)[0] == 403  # not his
        code, made = _call(url, "POST", "/api/v2/dags/commerce_flywheel__search/dagRuns", bob, run)
        assert code == 200 and made["dag_id"] == "commerce_flywheel__search"
        runs = _call(url, "GET", "/api/v2/dags/~/dagRuns", carol)[1]["dag_runs"]
        assert runs == [], "bob's run of search is not carol's to see"
    finally:
        stop_group(server)
