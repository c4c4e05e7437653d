"""`python -m docs.generate` (what `make docs` runs before `mkdocs build --strict`): the reference pages from the
code (settings, CLI, HTTP API) and the results pages from `bench/results/`. A setting, command, option or endpoint
without a description, or a results file without a commit, is one `error:` line and exit code 2."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from docs.generate import results
from docs.generate.provenance import ResultsError
from docs.generate.reference import REPO_ROOT, Undocumented, write_reference


def gateway_openapi() -> dict[str, Any]:
    """The gateway's OpenAPI schema, from the app itself (built on a throwaway root: nothing is served)."""
    from pipelines.config import load_settings
    from pipelines.gateway.app import create_app

    with tempfile.TemporaryDirectory(prefix="flywheel-docs-") as root:
        return create_app(load_settings(root=root, project="default")).openapi()


def main() -> int:
    import typer

    from pipelines.cli import app
    from pipelines.config import Settings

    docs = REPO_ROOT / "docs"
    try:
        written = write_reference(
            docs / "reference", settings_model=Settings, cli_root=typer.main.get_command(app), openapi=gateway_openapi()
        )
        written += results.render(REPO_ROOT / "bench" / "results", docs / "results")
    except (Undocumented, ResultsError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    for path in written:
        sys.stdout.write(f"wrote {Path(path).relative_to(REPO_ROOT)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
