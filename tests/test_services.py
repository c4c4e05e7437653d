"""`flywheel up` / `down` against the real Airflow and MLflow servers (slow: ~40 s)."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from helpers import listening_sockets, processes_with_env, run_flywheel
from pipelines.services import free_port

pytestmark = pytest.mark.slow


def test_up_then_down_leaves_no_process_behind(tmp_path: Path) -> None:
    root = tmp_path / "fw"
    env = {"FLYWHEEL_ROOT": str(root), "FLYWHEEL_AIRFLOW__PORT": str(free_port()),
           "FLYWHEEL_MLFLOW__PORT": str(free_port()), "FLYWHEEL_GATEWAY__PORT": str(free_port()),
           "FLYWHEEL_AIRFLOW__SCHEDULES": "paused"}  # no daily run in the background of this test
    marker = f"FLYWHEEL_ROOT={root}"
    try:
        up = run_flywheel("up", "--json", env=env)
        assert up.returncode == 0, up.stderr
        info = json.loads(up.stdout)
        assert info["airflow"]["healthy"] and info["mlflow"]["healthy"] and info["gateway"]["healthy"]
        assert info["gateway"]["url"] == f"http://127.0.0.1:{env['FLYWHEEL_GATEWAY__PORT']}/v1"
        assert Path(info["airflow"]["password_file"]).is_file()
        with urllib.request.urlopen(info["mlflow"]["url"] + "/health", timeout=5) as r:
            assert r.status == 200
        pids = processes_with_env(marker)
        assert len(pids) >= 6, "scheduler, dag processor, triggerer, API server, MLflow, gateway"
        # Every listening socket of ours is on the loopback interface.
        assert {address for address, _ in listening_sockets(pids)} == {"127.0.0.1"}

        status = json.loads(run_flywheel("status", "--json", env=env).stdout)
        assert status["airflow"]["running"] and status["mlflow"]["healthy"]
        again = run_flywheel("up", "--json", env=env)  # idempotent: already running is fine
        assert again.returncode == 0 and json.loads(again.stdout)["mlflow"]["pid"] == info["mlflow"]["pid"]
    finally:
        down = run_flywheel("down", "--json", env=env)
    assert down.returncode == 0, down.stderr
    assert processes_with_env(marker) == []
    for port in (env["FLYWHEEL_AIRFLOW__PORT"], env["FLYWHEEL_MLFLOW__PORT"], env["FLYWHEEL_GATEWAY__PORT"]):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", int(port))) != 0
    status = json.loads(run_flywheel("status", "--json", env=env).stdout)
    assert not status["airflow"]["running"] and not status["mlflow"]["running"]


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_flywheel("up", "--only", "mlflow", env={"FLYWHEEL_ROOT": str(tmp_path),
                                                             "FLYWHEEL_MLFLOW__PORT": str(port)})
    assert result.returncode == 2
    assert f"port 127.0.0.1:{port} is already in use" in result.stderr
