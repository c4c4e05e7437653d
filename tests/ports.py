"""Ports for the servers the tests start. `pipelines.services.free_port` asks the kernel for any free port,
and a test may bind it minutes later (a fixture trains, then deploys): meanwhile the other xdist worker, or any
process binding port 0, could be handed the same one. Here each test process claims a block of its own (a lock
file held for its life, so a second pytest run beside this one claims another) below the kernel's ephemeral
range (32768-60999 here: from 16768), and draws from it in turn, skipping a port something holds: a drawn port is never
drawn again, by any test process, and never handed out by the kernel."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from filelock import FileLock, Timeout

from pipelines.services import port_free

BLOCK, BLOCKS = 2000, 8


def _kernel_low() -> int:
    """The first port the kernel hands to a bind to port 0 (Linux; 32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


BASE = max(1024, _kernel_low() - BLOCKS * BLOCK)


def _worker() -> int:
    digits = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")  # "master" without xdist
    return int(digits) if digits.isdigit() else 0


def _claim() -> tuple[int, FileLock]:
    """The first block free of other test processes, from this worker's own; its lock is held until exit."""
    for i in range(BLOCKS):
        block = (_worker() + i) % BLOCKS
        lock = FileLock(str(Path(tempfile.gettempdir()) / f"flywheel-test-ports-{block}.lock"), timeout=0)
        try:
            lock.acquire()
        except Timeout:
            continue
        return BASE + block * BLOCK, lock
    raise RuntimeError(f"all {BLOCKS} blocks of test ports are held by other test processes")


_first, _lock = _claim()
_next = iter(range(_first, _first + BLOCK))


def free_port() -> int:
    # no SO_REUSEADDR in the check: a port in TIME_WAIT is skipped (a server binding without it would fail)
    port = next((p for p in _next if port_free("127.0.0.1", p, reuse_addr=False)), None)
    if port is None:
        raise RuntimeError(f"this process's {BLOCK} test ports ({_first}-{_first + BLOCK - 1}) are used up")
    return port
