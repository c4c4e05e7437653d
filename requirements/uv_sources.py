"""uv's package sources, read from pip's own configuration (pip.conf files and PIP_* variables).

`make setup` installs with uv, which reads neither; `make lock` resolves with pip, which reads both. So that
both see the same packages (this machine kind's local CPU torch wheel in a find-links folder, a local index
mirror, the machine's constraints file), this prints the matching uv options on one line: `--find-links`,
`--index-url`, `--extra-index-url` and `--constraint`, leaving out local folders and files that do not exist
(pip warns about those and goes on; uv would stop). Run with the Python that creates the venvs.
`uv_sources.py constraint` prints the `--constraint` options alone: uv refuses them next to `--require-hashes`
(every requirement of a hashed lock is pinned anyway), so only the unpinned side venvs take them.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

# Not the local index mirror (pip.conf's extra-index-url): through it uv took a soundfile wheel without its
# bundled libsndfile and NeMo's imports failed; the locks' packages come from PyPI, as in the measured runs.
OPTIONS = {"find-links": "--find-links", "constraint": "--constraint"}


def pip_config() -> dict[str, list[str]]:
    """Each option's values as pip sees them: a PIP_* variable overrides the files (`pip config list`)."""
    try:
        listed = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, dict[str, list[str]]] = {"env": {}, "file": {}}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        where, _, name = key.rpartition(".")
        if name in OPTIONS:
            found["env" if where.startswith(":env:") else "file"][name] = shlex.split(value.strip().strip("'\""))
    return {**found["file"], **found["env"]}


def usable(value: str) -> bool:
    """A URL, or a local folder or file that exists (file:// URLs included)."""
    parsed = urlparse(value)
    if parsed.scheme in ("http", "https"):
        return True
    path = unquote(parsed.path) if parsed.scheme == "file" else value
    return Path(path).exists()


def main(argv: list[str]) -> int:
    constraints = argv[:1] == ["constraint"]
    flags = [
        f"{OPTIONS[name]} {shlex.quote(value)}"
        for name, values in pip_config().items()
        for value in values
        if (name == "constraint") == constraints and usable(value)
    ]
    print(" ".join(flags))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
