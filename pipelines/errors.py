"""Errors that retrying cannot fix (an empty window, a failed quality gate, a bad parameter), and how
any error is shown to a user: one line, the traceback kept in a log file.

Airflow tasks turn NotRetryable into a fast failure without retries; anything else is retried with backoff.
"""

from __future__ import annotations

import json
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path

from pipelines.security import mask_uri_passwords


class NotRetryable(RuntimeError):
    """The run must stop here; the message says why and what to do."""


class DataProblem(NotRetryable):
    """The data is what stops the run (a failed quality gate, an empty window, a tool schema that cannot be
    enforced): the user fixes the data or the setting the message names; `flywheel run` exits 2."""


def one_line(exc: BaseException) -> str:
    """An exception from a library as one readable line: the system it came from and the first line of
    its message (URI passwords masked)."""
    text = str(exc).strip().splitlines()
    first = mask_uri_passwords(text[0] if text else "")
    if type(exc).__name__ == "MlflowException" or type(exc).__module__.startswith("mlflow"):
        return f"MLflow: {first[:300]}"
    if type(exc).__module__.startswith("tritonclient"):
        return f"Triton: {first[:300]}"
    if isinstance(exc, json.JSONDecodeError):
        return f"a JSON file is not valid JSON ({exc.msg} at line {exc.lineno})"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or type(exc).__name__}: {exc.filename}"
    return f"{type(exc).__name__}: {first[:300]}"


def keep_traceback(exc: BaseException, folder: Path) -> str:
    """Append the full traceback (passwords masked) to `folder/cli-errors.log`; returns where."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "cli-errors.log"
        with path.open("a", encoding="utf-8") as fh:
            fh.write(f"--- {datetime.now(UTC).isoformat()} flywheel {' '.join(sys.argv[1:])}\n")
            fh.write(mask_uri_passwords("".join(traceback.format_exception(exc))))
        return str(path)
    except OSError:
        return "not written: the logs folder is not writable"
