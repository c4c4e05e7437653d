"""`flywheel up` against the real servers: a busy port is one clear line. (Up, status, up again, down with
no process or open port left behind, every server on loopback: the scheduler scenario,
`test_drift_scenario.py`, which starts the whole platform once.)"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from helpers import run_flywheel

pytestmark = pytest.mark.slow


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_flywheel(
            "up", "--only", "mlflow", env={"FLYWHEEL_ROOT": str(tmp_path), "FLYWHEEL_MLFLOW__PORT": str(port)}
        )
    assert result.returncode == 2
    assert f"port 127.0.0.1:{port} is already in use" in result.stderr
