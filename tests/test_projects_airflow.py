"""Airflow itself keeps a project's DAGs to its members (`airflow.multi_team`, `auto` by default: on while a
project besides `default` exists; each project an Airflow team owning its own DAG bundle, one login per member
and project). Against the real API server with the DAGs parsed from the bundles into its metadata DB (`airflow
dags reserialize`)."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import run_flywheel, wait_for

from pipelines.config import ConfigError, load_settings

SHOP = {"commerce_flywheel__shop", "drift_monitor__shop"}
SEARCH = {"commerce_flywheel__search", "drift_monitor__search"}


def _call(
    url: str, method: str, path: str, token: str | None = None, body: dict[str, Any] | None = None
) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"{url}{path}",
        data=json.dumps(body).encode() if body is not None else None,  # noqa: S310
        method=method,
        headers={"Content-Type": "application/json"},
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None


def test_airflow_turns_multi_team_on_with_the_first_project_and_off_after_the_last(tmp_path: Path) -> None:
    """`auto`: a single-team platform runs Airflow as before (nothing prepared, no teams in any Airflow process);
    a project besides `default` turns the teams on at the next `prepare`, and until then every Airflow process
    keeps the layout the metadata DB has (the teams' file says it); `true` without prepared teams, or `false`
    with teams still in place, starts no Airflow process; off again (the last project deleted), `prepare` (no
    Airflow running) removes them: bundles, member logins, the teams' file.
    A switch is refused while Airflow runs (the health URL answers: here a stand-in) and while a `dags test`
    holds the layout. (Mutations tried: `auto` read as off, the slow test below fails at its first step; the
    guard for teams left in place removed, `_leave` keeping the teams' file, the switch taking the layout lock
    shared: this test fails.)"""
    from ports import free_port

    from pipelines.clients import airflow
    from pipelines.projects import airflow_access, registry
    from pipelines.stack import airflow as airflow_server

    settings = load_settings(root=str(tmp_path), airflow={"port": free_port()})
    teams = airflow_server.multi_team_env_file(settings)
    assert settings.airflow.multi_team == "auto" and not airflow_access.enabled(settings)
    with pytest.raises(ConfigError, match="airflow.multi_team: expected true, false or auto"):
        load_settings(root=str(tmp_path), airflow={"multi_team": "maybe"})
    assert airflow_access.prepare(settings) == {} and not teams.exists()
    assert "AIRFLOW__CORE__MULTI_TEAM" not in airflow_server.airflow_env(settings)
    registry.create(settings, "shop", "alice")
    assert airflow_access.enabled(settings)
    assert "AIRFLOW__CORE__MULTI_TEAM" not in airflow_server.airflow_env(settings)  # the DB single-team until prepared
    with (
        _health(settings.airflow.port),
        pytest.raises(
            airflow.AirflowUnavailable,
            match=(
                r"projects besides `default`\), and the running Airflow started without teams: apply it with `flywheel "
                r"down && flywheel up` \(or keep Airflow single-team: FLYWHEEL_AIRFLOW__MULTI_TEAM=false\)"
            ),
        ),
    ):
        airflow_access.prepare(settings)  # a single-team Airflow runs
    with airflow_server.layout(settings), pytest.raises(airflow.AirflowUnavailable, match="`airflow dags test` run"):
        airflow_access.prepare(settings)  # a single-team `dags test` runs
    assert not teams.exists()
    on = load_settings(root=str(tmp_path), airflow={"port": settings.airflow.port, "multi_team": True})
    with pytest.raises(airflow.AirflowUnavailable, match="not prepared"):
        airflow_server.airflow_env(on)
    off = load_settings(root=str(tmp_path), airflow={"port": settings.airflow.port, "multi_team": False})
    assert not airflow_access.enabled(off) and "AIRFLOW__CORE__MULTI_TEAM" not in airflow_server.airflow_env(off)
    # teams prepared before (as `prepare` leaves them) while the platform is now single-team
    teams.write_text(json.dumps({"AIRFLOW__CORE__MULTI_TEAM": "True"}))
    bundle = airflow_access.bundle_dir(settings, "shop")
    bundle.mkdir(parents=True)
    airflow.password_file(settings).write_text(json.dumps({"admin": "a", "alice@shop": "b"}))
    airflow_access.login_password_file(settings, "alice@shop").parent.mkdir(parents=True, exist_ok=True)
    airflow_access.login_password_file(settings, "alice@shop").write_text("b\n")
    assert airflow_server.airflow_env(settings)["AIRFLOW__CORE__MULTI_TEAM"] == "True"
    registry.delete(settings, "shop")
    assert not airflow_access.enabled(settings)
    assert airflow_server.airflow_env(settings)["AIRFLOW__CORE__MULTI_TEAM"] == "True"  # the DB's teams until left
    with pytest.raises(airflow.AirflowUnavailable, match="still in place.*which removes them"):
        airflow_server.airflow_env(off)
    with (
        _health(settings.airflow.port),
        pytest.raises(
            airflow.AirflowUnavailable,
            match=(r"which is now off \(airflow.multi_team: auto, and no project besides `default` is left\)"),
        ),
    ):
        airflow_access.prepare(settings)  # the teams' Airflow runs
    with airflow_server.layout(settings), pytest.raises(airflow.AirflowUnavailable, match="`airflow dags test` run"):
        airflow_access.prepare(settings)  # a `dags test` on the teams runs
    assert teams.exists() and bundle.exists() and airflow_access.login_password_file(settings, "alice@shop").exists()
    assert airflow_access.prepare(settings) == {}  # no Airflow runs on its port: the teams go
    assert not teams.exists() and not bundle.parent.exists()
    assert json.loads(airflow.password_file(settings).read_text()) == {"admin": "a"}
    assert not airflow_access.login_password_file(settings, "alice@shop").exists()
    assert "AIRFLOW__CORE__MULTI_TEAM" not in airflow_server.airflow_env(settings)


def test_what_a_project_command_says_of_airflow_depends_on_whether_one_runs(tmp_path: Path, monkeypatch) -> None:
    """`project create`/`members`/`delete` say when Airflow applies the change: at its next start when none runs,
    after a restart (and refusing meanwhile) while one answers; nothing on a single-team platform. (Mutation
    tried: the running check left out, the stopped case names a restart: fails.)"""
    from ports import free_port

    from pipelines.cli import projects as cli
    from pipelines.projects import registry

    settings = load_settings(root=str(tmp_path), airflow={"port": free_port()})
    monkeypatch.setattr(cli, "_platform", lambda: settings)
    assert cli._airflow_note("default", "admin", True) == {}  # single-team: nothing to say
    registry.create(settings, "shop", "alice")
    stopped = cli._airflow_note("shop", "alice", True)
    assert stopped["airflow"].endswith("only its members see: from Airflow's next start (`flywheel up`)"), stopped
    assert stopped["airflow_login"].startswith("alice@shop, password in ")
    assert stopped["airflow_login"].endswith(": from Airflow's next start (`flywheel up`)")
    with _health(settings.airflow.port):
        running = cli._airflow_note("shop", "alice", True)
    assert (
        "until Airflow restarts (`flywheel down && flywheel up`), `flywheel up` and `flywheel run` refuse"
        in running["airflow"]
    ), running
    assert "Airflow applies it when restarted" in running["airflow_login"]


@pytest.mark.slow
def test_a_projects_dags_are_listed_read_and_triggered_by_its_members_only(tmp_path: Path) -> None:
    """carol (viewer of shop) lists and reads shop's DAGs only, gets 403 for search's and cannot trigger shop's;
    bob (owner of search) triggers search's and gets 403 triggering shop's; admin sees every project's.
    (Mutations tried: each login given every project's team, carol lists search's DAGs; a viewer mapped to
    Airflow's `user` role, carol's trigger is accepted; the bundle copies not fixed to their project, Airflow
    refuses a DAG id in two bundles; the bundles without their teams, the API server refuses the logins; no
    refusal while Airflow runs, the late member's change is written under the running servers.)"""
    from ports import free_port

    from pipelines.clients import airflow
    from pipelines.projects import airflow_access, registry
    from pipelines.services import http_ok, stop_group
    from pipelines.stack import airflow as airflow_server

    settings = load_settings(root=str(tmp_path), airflow={"port": free_port()})  # multi_team: auto
    # a platform that ran single-team first: its DAGs in the metadata DB on the one DAG-folder bundle
    migrated = airflow_server.run_cli(settings, "db", "migrate", timeout=600)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    parsed = airflow_server.run_cli(settings, "dags", "reserialize", timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert _bundles(settings) == {"commerce_flywheel": "dags-folder", "drift_monitor": "dags-folder"}
    registry.create(settings, "shop", "alice")
    registry.create(settings, "search", "bob")
    env = {"FLYWHEEL_ROOT": str(tmp_path), "FLYWHEEL_AIRFLOW__PORT": str(settings.airflow.port)}
    added = run_flywheel("project", "members", "shop", "add", "carol", "--role", "viewer", "--json", env=env)
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["airflow_login"].startswith("carol@shop, password in ")  # what carol logs in as
    prepared = airflow_access.prepare(settings)
    assert airflow_access.prepare(settings) == prepared  # nothing changed: nothing done again
    # Airflow's teams need 3 characters, projects 2: padded with a character no project name holds
    assert [airflow_access.team_name(p) for p in ("ab", "ab_", "shop")] == ["ab-", "ab_", "shop"]
    shop_file = airflow_access.bundle_dir(settings, "shop") / "commerce_flywheel.py"
    assert "BUNDLE_PROJECT: str | None = 'shop'" in shop_file.read_text()
    parsed = airflow_server.run_cli(settings, "dags", "reserialize", timeout=600)  # every bundle into the metadata DB
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert _bundles(settings) == {
        f"{dag}{suffix}": f"project-{project}"
        for dag in ("commerce_flywheel", "drift_monitor")
        for project, suffix in (("default", ""), ("shop", "__shop"), ("search", "__search"))
    }

    home = Path(str(settings.airflow.home))
    server = subprocess.Popen(
        [str(airflow_server.bin_dir() / "airflow"), "api-server"],
        env=airflow_server.airflow_env(settings),  # noqa: S603
        cwd=str(home),
        stdout=(home / "api.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = airflow.base_url(settings)
        wait_for(
            lambda: http_ok(f"{url}{airflow.HEALTH_PATH}") or server.poll() is not None,
            240,
            "the Airflow API server",
            interval_s=2,
        )
        assert server.poll() is None, (home / "api.log").read_text()[-3000:]
        passwords = json.loads(airflow.password_file(settings).read_text())
        assert airflow.password_file(settings).stat().st_mode & 0o777 == 0o600  # it holds admin's too
        for user in ("alice@shop", "carol@shop", "bob@search"):  # each login's own file, what its member reads
            own = airflow_access.login_password_file(settings, user)
            assert own.read_text().strip() == passwords[user] and own.stat().st_mode & 0o777 == 0o600
            assert passwords[user] not in (home / "api.log").read_text()  # generated by us: Airflow printed none

        def token(user: str) -> str:
            code, body = _call(url, "POST", "/auth/token", body={"username": user, "password": passwords[user]})
            assert code == 201, (user, code)
            return body["access_token"]

        admin, carol, bob, alice = (token(u) for u in ("admin", "carol@shop", "bob@search", "alice@shop"))
        listed = {
            u: {d["dag_id"] for d in _call(url, "GET", "/api/v2/dags?limit=100", t)[1]["dags"]}
            for u, t in (("admin", admin), ("carol", carol), ("bob", bob))
        }
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
        # a member added while Airflow runs is not half-applied: refused until Airflow restarts
        registry.set_member(settings, "search", "dave", "viewer")
        before = airflow_server.multi_team_env_file(settings).read_text()
        with pytest.raises(airflow.AirflowUnavailable, match="flywheel down && flywheel up"):
            airflow_access.prepare(settings)
        assert airflow_server.multi_team_env_file(settings).read_text() == before
        off = load_settings(root=str(tmp_path), airflow={"port": settings.airflow.port, "multi_team": False})
        with pytest.raises(airflow.AirflowUnavailable, match="flywheel down && flywheel up"):  # nor left
            airflow_access.prepare(off)
        assert airflow_server.multi_team_env_file(settings).read_text() == before
        assert airflow_access.bundle_dir(settings, "shop").is_dir()
    finally:
        stop_group(server)
    # Airflow stopped: a deleted project's bundle, team logins and their passwords go at the next prepare
    registry.delete(settings, "search")
    airflow_access.prepare(settings)
    assert not airflow_access.bundle_dir(settings, "search").exists()
    left = json.loads(airflow.password_file(settings).read_text())
    assert "bob@search" not in left and "carol@shop" in left
    assert not airflow_access.login_password_file(settings, "bob@search").exists()
    # the last project deleted: single-team again, and the DAGs back on the one DAG-folder bundle
    deleted = run_flywheel("project", "delete", "shop", "--json", env=env)
    assert deleted.returncode == 0, deleted.stderr
    assert (
        "Airflow turns single-team again (no project besides `default` is left)"
        in json.loads(deleted.stdout)["airflow"]
    )
    assert airflow_access.prepare(settings) == {} and not airflow_server.multi_team_env_file(settings).exists()
    assert "carol@shop" not in json.loads(airflow.password_file(settings).read_text())
    parsed = airflow_server.run_cli(settings, "dags", "reserialize", timeout=600)
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    rows = _bundles(settings)  # a deleted project's DAGs stay on its gone bundle (the dag processor marks them stale)
    assert {dag: bundle for dag, bundle in rows.items() if bundle == "dags-folder"} == {
        "commerce_flywheel": "dags-folder",
        "drift_monitor": "dags-folder",
    }
    assert {rows[f"{dag}__{p}"] for dag in ("commerce_flywheel", "drift_monitor") for p in ("shop", "search")} == {
        "project-shop",
        "project-search",
    }


@contextmanager
def _health(port: int) -> Iterator[None]:
    """A stand-in for a running Airflow API server: something answering its health URL on `port` (to `prepare`,
    a running Airflow). The real server, running while a member changes, is in
    tests/test_projects_airflow.py::test_a_projects_dags_are_listed_read_and_triggered_by_its_members_only."""

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _bundles(settings: Any) -> dict[str, str]:
    """Each DAG of the metadata DB (not stale) and its bundle, as `airflow dags list` shows them."""
    from pipelines.stack import airflow as airflow_server

    listed = airflow_server.run_cli(settings, "dags", "list", "-o", "json", timeout=300)
    assert listed.returncode == 0, listed.stderr[-3000:]
    return {row["dag_id"]: row["bundle_name"] for row in json.loads(listed.stdout.strip().splitlines()[-1])}
