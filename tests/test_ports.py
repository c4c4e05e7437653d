"""The tests' own ports (tests/ports.py): each xdist worker its own block, below the kernel's ephemeral range."""

from __future__ import annotations

import socket
from pathlib import Path

import ports


def test_a_worker_draws_each_port_once_from_its_own_block_below_the_kernels_range(monkeypatch) -> None:
    first, second = ports.free_port(), ports.free_port()
    assert first != second and all(ports._first <= p < ports._first + ports.BLOCK for p in (first, second))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:  # something else holds the next one
        held.bind(("127.0.0.1", second + 1))
        assert ports.free_port() == second + 2
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert ports.BASE + 8 * ports.BLOCK <= low, "eight workers' blocks lie below the ports the kernel hands out"
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert ports._worker() == 1
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "master")
    assert ports._worker() == 0
