"""Helpers for tests that run the real `flywheel` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

FLYWHEEL = str(Path(sys.executable).parent / "flywheel")


def run_flywheel(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    full_env.update(env or {})
    return subprocess.run([FLYWHEEL, *args], env=full_env, capture_output=True, text=True, timeout=timeout,
                          check=False)


def processes_with_env(marker: str) -> list[int]:
    """PIDs of live processes whose environment contains `marker` (e.g. FLYWHEEL_ROOT=<tmp>)."""
    needle = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
    return found
