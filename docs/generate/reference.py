"""The reference pages, generated from the code so they cannot drift from it: every setting (from the pydantic
`Settings`), every CLI command and option (from the Typer app), every gateway endpoint (from the app's OpenAPI
schema). `make docs` runs `python -m docs.generate` before `mkdocs build --strict`.

A setting, command or option without a description is an error here (`Undocumented`), so a new one cannot slip
in undocumented; `tests/test_docs_reference.py` holds that rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_PREFIX = "FLYWHEEL_"


class Undocumented(ValueError):
    """Settings, commands or options without a description; the message lists them."""


# ---- settings -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SettingRow:
    dotted: str
    env: str
    type: str
    default: str
    description: str


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation)
    for noise in ("typing.", "pydantic.types.", "collections.abc."):
        text = text.replace(noise, "")
    return text.replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, SecretStr):
        return "(secret)"
    text = json.dumps(value, default=str) if isinstance(value, dict | list | bool) else str(value)
    return text.replace(str(REPO_ROOT), "<repo>")


def setting_rows(model: type[BaseModel], prefix: str = "") -> Iterator[SettingRow]:
    """Every leaf setting of `model`, depth first, in declaration order."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from setting_rows(annotation, f"{prefix}{name}.")
            continue
        dotted = f"{prefix}{name}"
        yield SettingRow(
            dotted=dotted,
            env=ENV_PREFIX + dotted.upper().replace(".", "__"),
            type=_type_name(annotation),
            default=_default(field),
            description=" ".join((field.description or "").split()),
        )


def sections(model: type[BaseModel]) -> list[tuple[str, str, type[BaseModel] | None]]:
    """(name, intro, section model) of each top-level section; the top-level scalars come first as `general`."""
    found: list[tuple[str, str, type[BaseModel] | None]] = [("general", "The platform as a whole.", None)]
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.append((name, " ".join((annotation.__doc__ or "").split()), annotation))
    return found


def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, `<` and `>` kept as text (never read as HTML)."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;").replace(">", "&gt;")


def _code(text: str) -> str:
    """Code in a table cell: a code span, or with a pipe in it HTML (a backslash-escaped pipe inside a Markdown
    code span would show its backslash, `str \\| None`, so the pipe is an entity in a <code> element)."""
    import html

    text = text.replace("\n", " ")
    if "|" not in text:
        return f"`{text}`"
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def settings_page(model: type[BaseModel]) -> str:
    rows = list(setting_rows(model))
    missing = [r.dotted for r in rows if not r.description]
    if missing:
        raise Undocumented(f"settings without a description: {', '.join(missing)}")
    out = [
        "# Settings",
        "",
        "Every setting of the one `Settings` object, generated from `pipelines/config/`. Precedence, highest first:",
        "keyword arguments, `FLYWHEEL_*` environment variables (nested with `__`), the YAML file named by",
        "`FLYWHEEL_CONFIG`, then the profile's defaults. `flywheel config show` prints the effective values",
        "(secrets masked). A default of *unset* is filled in by the profile (the local profile: a path under the",
        "root) or means the feature is off.",
        "",
    ]
    for name, intro, section in sections(model):
        in_section = [r for r in rows if (r.dotted.startswith(f"{name}.") if section else "." not in r.dotted)]
        out += [f"## `{name}`", "", intro, "", "| setting | environment variable | type | default | description |"]
        out.append("|---|---|---|---|---|")
        out += [
            f"| `{r.dotted}` | `{r.env}` | {_code(r.type)} | {_code(r.default)} | {_cell(r.description)} |"
            for r in in_section
        ]
        out.append("")
    return "\n".join(out)


# ---- the CLI ------------------------------------------------------------------------------------------------
def _commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name in sorted(group.commands):
        command = group.commands[name]
        if getattr(command, "hidden", False):
            continue
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def _first_line(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def _option_row(param: Any) -> tuple[str, str, str, str]:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    kind = _type_name(param.type_descriptor.annotation) if hasattr(param, "type_descriptor") else "text"
    default = "" if param.default in (None, False, ()) or param.required else _code(str(param.default))
    return names, kind, default, " ".join((getattr(param, "help", None) or "").split())


def cli_page(root: Any) -> str:
    missing: list[str] = []
    out = [
        "# CLI",
        "",
        "Every `flywheel` command and option, generated from the Typer app (`pipelines/cli/`). Every command takes",
        "the global `--project NAME` first (`flywheel --project search run ...`). Errors a user can fix print one",
        "`error:` line and exit 2.",
        "",
    ]
    for path, command in _commands(root):
        words = " ".join(path)
        if not _first_line(command.help):
            missing.append(f"flywheel {words}")
        if hasattr(command, "commands"):
            out += [f"## `flywheel {words}`", "", _first_line(command.help), ""]
            continue
        out += [f"### `flywheel {words}`", "", " ".join((command.help or "").split()), ""]
        arguments = [p for p in command.params if p.param_type_name == "argument"]
        options = [p for p in command.params if p.param_type_name == "option" and p.name != "help"]
        if arguments:
            out.append("Arguments: " + ", ".join(f"`{a.name.upper()}`" for a in arguments) + "")
            out.append("")
        if options:
            out += ["| option | type | default | description |", "|---|---|---|---|"]
            for option in options:
                names, kind, default, text = _option_row(option)
                if not text:
                    missing.append(f"flywheel {words} {option.opts[0]}")
                out.append(f"| {names} | {_code(kind)} | {default} | {_cell(text)} |")
            out.append("")
    if missing:
        raise Undocumented(f"commands or options without a description: {', '.join(missing)}")
    return "\n".join(out)


# ---- the HTTP API -------------------------------------------------------------------------------------------
def http_page(schema: dict[str, Any]) -> str:
    """The gateway's endpoints from its OpenAPI schema: method, path, summary, request and response bodies."""
    missing: list[str] = []
    out = [
        "# HTTP API",
        "",
        "The gateway's endpoints, generated from its OpenAPI schema (`pipelines/gateway/`). Every path but the",
        "probes needs `Authorization: Bearer <key>`; errors come in OpenAI's shape",
        '(`{"error": {"message", "type", "param", "code"}}`). Examples: [Serving and the gateway](../serving.md).',
        "",
    ]
    components = schema.get("components", {}).get("schemas", {})
    for path, methods in sorted(schema.get("paths", {}).items()):
        for method, operation in methods.items():
            summary = operation.get("summary") or ""
            description = " ".join((operation.get("description") or "").split())
            if not description:
                missing.append(f"{method.upper()} {path}")
            out += [f"## `{method.upper()} {path}`", "", f"**{summary}**" if summary else "", "", description, ""]
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                out += ["Request body:", "", *_schema_table(body, components), ""]
            out += ["| response | meaning |", "|---|---|"]
            for code, response in sorted(operation.get("responses", {}).items()):
                out.append(f"| `{code}` | {_cell(response.get('description', ''))} |")
            out.append("")
    if missing:
        raise Undocumented(f"endpoints without a description: {', '.join(missing)}")
    return "\n".join(out)


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    return components.get(ref.rsplit("/", 1)[-1], {}) if ref else schema


def _schema_table(schema: dict[str, Any], components: dict[str, Any]) -> list[str]:
    schema = _resolve(schema, components)
    required = set(schema.get("required", []))
    rows = ["| field | type | required | description |", "|---|---|---|---|"]
    for name, prop in schema.get("properties", {}).items():
        prop = _resolve(prop, components)
        kind = prop.get("type") or " or ".join(p.get("type", "object") for p in prop.get("anyOf", [])) or "object"
        text = " ".join((prop.get("description") or prop.get("title") or "").split())
        rows.append(f"| `{name}` | {kind} | {'yes' if name in required else ''} | {_cell(text)} |")
    return rows


# ---- writing ------------------------------------------------------------------------------------------------
def write_reference(
    out_dir: Path, *, settings_model: type[BaseModel], cli_root: Any, openapi: dict[str, Any]
) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    pages = {
        "settings.md": settings_page(settings_model),
        "cli.md": cli_page(cli_root),
        "http.md": http_page(openapi),
    }
    written = []
    for name, text in pages.items():
        path = out_dir / name
        path.write_text(text.rstrip() + "\n", encoding="utf-8")
        written.append(path)
    return written
