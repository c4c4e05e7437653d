"""What every `flywheel` command module shares: the stderr console, `--json`, one-line user errors
and the result printer (kept apart so command modules never import each other)."""

from __future__ import annotations

import json
import os
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from pipelines.config import DEFAULT_PROJECT, Settings, load_settings

WIDE = 1000


def _width(stream: object) -> int | None:
    """Under CI, a pipe or a file there is no terminal and rich would wrap and cut at 80 columns (paths ending
    in an ellipsis): there, lines are as long as what they say. A terminal keeps its own width; COLUMNS, when
    set, wins. Per stream: `flywheel run --json > f` keeps its stderr spinner at the terminal's width."""
    return None if os.environ.get("COLUMNS") or getattr(stream, "isatty", lambda: False)() else WIDE


console = Console(stderr=True, width=_width(sys.stderr))


def stdout_console() -> Console:
    """Where tables and results go (stdout), at its own width."""
    return Console(width=_width(sys.stdout))


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
    stdout_console().print(table)


@dataclass
class Invocation:
    """One `flywheel` command line: the project its global `--project` names and, once loaded, its settings."""

    project: str | None = None
    settings: Settings | None = None


INVOCATION: ContextVar[Invocation] = ContextVar("flywheel_invocation")


def cli_settings() -> Settings:
    """The settings this invocation works with: the configuration (FLYWHEEL_* environment, the FLYWHEEL_CONFIG file)
    in the project the global `--project` names (else FLYWHEEL_PROJECT, else `default`), which must exist. Loaded
    once per command line (the root callback starts it, `main` ends it); each command passes them down."""
    invocation = INVOCATION.get(None) or Invocation()
    if invocation.settings is None:
        project = invocation.project
        settings = load_settings(**({"project": project} if project else {}))
        if settings.project != DEFAULT_PROJECT:
            from pipelines.projects import registry

            try:
                registry.check_name(settings.project)
                registry.get(settings, settings.project)
            except registry.ProjectError as exc:
                raise UserError(f"--project: {exc}") from None
        invocation.settings = settings
    return invocation.settings


def local_settings(command: str) -> Settings:
    settings = cli_settings()
    if not settings.is_local:
        raise UserError(f"`flywheel {command}` manages local servers; the cluster profile runs them on Kubernetes")
    return settings


def progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def parse_date(value: str | None, option: str) -> date:
    if value is None:
        return datetime.now(UTC).date()
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise UserError(f"{option}: expected a date like 2026-11-22, got {value!r}") from None


EndOpt = Annotated[
    str | None, typer.Option("--end-date", help="Last day of the window, YYYY-MM-DD (default: yesterday).")
]
DaysOpt = Annotated[int, typer.Option("--window-days", min=1, help="Days in the window, ending at --end-date.")]


def window_arg(end_date: str | None, window_days: int) -> dict[str, str]:
    from pipelines.tasks import resolve_window

    if end_date:
        parse_date(end_date, "--end-date")
    return resolve_window({"end_date": end_date, "window_days": window_days})


def print_table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    stdout_console().print(table)
