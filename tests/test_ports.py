"""The tests' own ports (tests/ports.py): each test process its own block, below the kernel's ephemeral range."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import ports


def test_a_process_draws_each_port_once_from_a_block_no_other_test_process_holds() -> None:
    first, second = ports.free_port(), ports.free_port()
    assert first != second and all(ports._first <= p < ports._first + ports.BLOCK for p in (first, second))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:  # something else holds the next one
        held.bind(("127.0.0.1", second + 1))
        assert ports.free_port() == second + 2
    assert ports._kernel_low() >= ports.BASE + ports.BLOCKS * ports.BLOCK, "every block lies below the kernel's ports"
    # a second test process (another worker, another pytest run), here named as this one: another block
    other = subprocess.run(
        [sys.executable, "-c", "import ports; print(ports._first)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).parent,
        env={"PYTEST_XDIST_WORKER": os.environ.get("PYTEST_XDIST_WORKER", "gw0")},
    )
    assert int(other.stdout) != ports._first
