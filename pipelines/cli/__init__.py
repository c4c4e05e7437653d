"""`flywheel`: one entry point for every stage and the local servers, one module per group of commands.

Commands only parse arguments and call `pipelines` functions; errors a user can fix (bad config,
bad arguments, a busy port) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.exceptions import TyperException

from pipelines.cli import admin, data, logs, models, serving, stack
from pipelines.cli.common import INVOCATION, Invocation, UserError, cli_settings
from pipelines.cli.gateway import gateway_app
from pipelines.cli.projects import project_app, select
from pipelines.cli.tune import tune_app
from pipelines.config import ConfigError
from pipelines.errors import keep_traceback, one_line
from pipelines.security import mask_uri_passwords

app = typer.Typer(
    name="flywheel",
    help="Commerce Flywheel: keep a commerce agent's tool-calling model fast, cheap and good.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for _module in (admin, logs, data, models, serving, stack):
    app.add_typer(_module.app)  # top-level commands (no group name)
app.add_typer(logs.logs_app, name="logs")
app.add_typer(admin.config_app, name="config")
app.add_typer(logs.tools_app, name="tools")
app.add_typer(data.features_app, name="features")
app.add_typer(data.labels_app, name="labels")
app.add_typer(tune_app, name="tune")
app.add_typer(models.registry_app, name="registry")
app.add_typer(serving.serve_app, name="serve")
app.add_typer(stack.drift_app, name="drift")
app.add_typer(stack.schedules_app, name="schedules")
app.add_typer(gateway_app, name="gateway")
app.add_typer(project_app, name="project")


@app.callback()
def _root(
    project: Annotated[
        str | None,
        typer.Option("--project", help="The AI project to work in (default: FLYWHEEL_PROJECT, else `default`)."),
    ] = None,
) -> None:
    """Commerce Flywheel: keep a commerce agent's tool-calling model fast, cheap and good."""
    select(project)


def plain_help(typer_app: typer.Typer) -> None:
    """Help as plain text, wrapped at words: without a terminal (CI logs, pipes, files) Typer's panels would wrap
    inside words and cut option descriptions with an ellipsis at 80 columns."""
    typer_app.rich_markup_mode = None
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            plain_help(group.typer_instance)


def main(argv: list[str] | None = None) -> None:
    """Entry point: usage and configuration errors become one line on stderr and exit code 2."""
    from pipelines.demo import DemoFailed
    from pipelines.errors import NotRetryable
    from pipelines.services import ServiceError

    if not (os.environ.get("COLUMNS") or sys.stdout.isatty()):
        plain_help(app)
    command = typer.main.get_command(app)
    started = INVOCATION.set(Invocation())  # this command line's project and settings (`--project` fills it)
    try:
        code = command.main(args=argv, prog_name="flywheel", standalone_mode=False)
        if isinstance(code, int) and code:  # click returns (not raises) typer.Exit's code here
            sys.exit(code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except TyperException as exc:  # usage errors: unknown command, bad option value, ...
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.exit(0)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        sys.stderr.write(f"error: {message}\n")
        sys.exit(2)
    except (ConfigError, UserError, ServiceError, DemoFailed, NotRetryable) as exc:
        sys.stderr.write(f"error: {mask_uri_passwords(str(exc))}\n")
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("aborted\n")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 (MLflow, Triton, a corrupt file, ...: one line, the traceback kept)
        sys.stderr.write(f"error: {one_line(exc)} (traceback: {keep_traceback(exc, _logs_folder())})\n")
        sys.exit(1)
    finally:
        INVOCATION.reset(started)


def _logs_folder() -> Path:
    import tempfile

    try:
        return Path(str(cli_settings().root)) / "logs"
    except Exception:  # noqa: BLE001 (a broken configuration: still keep the traceback)
        return Path(tempfile.gettempdir())


if __name__ == "__main__":
    main()
