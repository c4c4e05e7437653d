"""What every `flywheel` command module shares: the stderr console, `--json`, one-line user errors
and the result printer (kept apart so command modules never import each other)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from pipelines.config import Settings, get_settings

console = Console(stderr=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON result on stdout.")]


class UserError(Exception):
    """Something the user can fix; printed as one line."""


def emit(data: dict[str, Any], as_json: bool, title: str) -> None:
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    table = Table(title=title, show_header=False)
    for key, value in data.items():
        table.add_row(str(key), json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value))
    Console().print(table)


def local_settings(command: str) -> Settings:
    settings = get_settings()
    if not settings.is_local:
        raise UserError(f"`flywheel {command}` manages local servers; the cluster profile runs them on Kubernetes")
    return settings
