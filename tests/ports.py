"""Ports for the servers the tests start. `pipelines.services.free_port` asks the kernel for any free port,
and a test may bind it minutes later (a fixture trains, then deploys): meanwhile the other xdist worker, or any
process binding port 0, could be handed the same one. Here each worker draws in turn from its own block below
the kernel's ephemeral range (32768-60999 here), skipping a port something holds, so a drawn port is never
drawn again, by either worker, and never handed out by the kernel."""

from __future__ import annotations

import itertools
import os
import socket

BASE, BLOCK = 16000, 2000


def _worker() -> int:
    digits = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")  # "master" without xdist
    return int(digits) if digits.isdigit() else 0


_first = BASE + _worker() * BLOCK
_next = itertools.count(_first)


def _unused(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no SO_REUSEADDR: a port in TIME_WAIT is skipped
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    for port in _next:
        if port >= _first + BLOCK:
            raise RuntimeError(f"this worker's {BLOCK} test ports ({_first}-{_first + BLOCK - 1}) are used up")
        if _unused(port):
            return port
    raise AssertionError("unreachable")
