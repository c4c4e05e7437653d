"""The reference pages are generated from the code (docs/generate/reference.py): a new setting, command or option
shows up with no hand edit, and one without a description cannot slip in."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from pydantic import BaseModel, Field

from docs.generate.reference import Undocumented, cli_page, http_page, settings_page
from pipelines.config import GatewaySettings, Settings


def test_every_setting_is_on_the_page_with_its_variable_type_default_and_description() -> None:
    page = settings_page(Settings)
    for dotted, env in (("gateway.port", "FLYWHEEL_GATEWAY__PORT"), ("promotion.non_inferiority_margin", None)):
        row = next(line for line in page.splitlines() if line.startswith(f"| `{dotted}` |"))
        assert (env or "FLYWHEEL_") in row and row.count("|") >= 6
    assert "`8400`" in next(line for line in page.splitlines() if line.startswith("| `gateway.port` |"))
    assert str(Path(__file__).resolve().parents[1]) not in page  # paths shown relative to the repository


def test_a_new_described_setting_changes_the_page_and_an_undescribed_one_is_refused() -> None:
    """(Mutation: `settings_page` without its `missing` check lets the second model through.)"""

    class Described(GatewaySettings):
        retry_budget: int = Field(3, description="how often a caller may retry")

    class Extended(Settings):
        gateway: Described = Field(default_factory=Described)

    page = settings_page(Extended)
    assert "| `gateway.retry_budget` | `FLYWHEEL_GATEWAY__RETRY_BUDGET` | `int` | `3` | how often" in page
    assert "retry_budget" not in settings_page(Settings)

    class Silent(BaseModel):
        knob: int = 1

    with pytest.raises(Undocumented, match="knob"):
        settings_page(Silent)


def test_every_command_and_option_is_on_the_page_and_one_without_help_is_refused() -> None:
    from pipelines.cli import app

    page = cli_page(typer.main.get_command(app))
    for command in ("flywheel run", "flywheel project create", "flywheel gateway up", "flywheel eval"):
        assert f"`{command}`" in page
    assert "`--window-days`" in page and "`--constrained`" in page

    extra = typer.Typer()

    @extra.command("documented")
    def documented(level: int = typer.Option(1, help="how loud")) -> None:
        """Says something."""

    @extra.command("bare")
    def bare(level: int = typer.Option(1)) -> None:
        """No help on its option."""

    with pytest.raises(Undocumented, match="bare --level"):
        cli_page(typer.main.get_command(extra))


def test_every_gateway_endpoint_is_on_the_page_with_its_request_body(tmp_path: Path) -> None:
    from pipelines.config import load_settings
    from pipelines.gateway.app import create_app

    schema = create_app(load_settings(root=str(tmp_path))).openapi()
    page = http_page(schema)
    for endpoint in ("POST /v1/chat/completions", "POST /v1/feedback", "GET /v1/models", "GET /ready"):
        assert f"## `{endpoint}`" in page
    body = page[page.index("## `POST /v1/chat/completions`") :].split("## ")[1]
    assert "| `messages` | array | yes |" in body and "| `429` |" in body
    schema["paths"]["/v1/models"]["get"]["description"] = ""
    with pytest.raises(Undocumented, match="GET /v1/models"):
        http_page(schema)
