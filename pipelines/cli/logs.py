"""`flywheel logs`: generate, check, import and describe commerce-agent logs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.common import JsonOpt, UserError, cli_settings, console
from pipelines.cli.common import emit as _emit
from pipelines.cli.common import parse_date as _parse_date
from pipelines.cli.common import progress as _progress

app = typer.Typer()  # this module's top-level commands (merged into `flywheel`)
logs_app = typer.Typer(help="Generate, check and describe commerce-agent logs.", no_args_is_help=True)


@logs_app.command("generate")
def logs_generate(
    records: Annotated[int, typer.Option(min=0, help="How many log records (agent turns) to write.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Random seed; the same seed and options give byte-identical files.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Raw zone folder; default: the configured raw zone.")] = None,
    days: Annotated[int, typer.Option(min=1, help="Spread records over this many daily partitions.")] = 1,
    end_date: Annotated[str | None, typer.Option(help="Last partition date, YYYY-MM-DD (default: today, UTC).")] = None,
    drift: Annotated[str, typer.Option(help="Traffic shift: none, holiday, new-category, locale, tool-mix.")] = "none",
    drift_magnitude: Annotated[float, typer.Option(min=0.0, max=1.0, help="Strength of the drift, 0..1.")] = 0.6,
    bad_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="Share of bad records (all kinds).")] = 0.05,
    gzip_output: Annotated[bool, typer.Option("--gzip", help="Write .jsonl.gz instead of .jsonl.")] = False,
    slip: Annotated[
        str | None,
        typer.Option(
            help="Inject a teacher's mistake, INTENT:WRONG[:SHARE] (e.g. get_order:track_shipment:0.3): that share "
            "of the intent's turns, asked in the slip's phrasings, logged as WRONG; 20 % of them rated down, 20 % of "
            "the other answers rated up."
        ),
    ] = None,
    slip_truth: Annotated[
        bool, typer.Option(help="With --slip: the slip's phrasings with the right calls (a held-out set).")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write realistic synthetic commerce-agent traffic into date partitions of the raw zone."""
    from pipelines.simulate.generator import Drift, GeneratorConfig, Slip, write_raw_logs

    try:
        drift_kind = Drift(drift)
    except ValueError:
        raise UserError(f"--drift: expected one of {', '.join(d.value for d in Drift)}, got {drift!r}") from None
    if slip_truth and slip is None:
        raise UserError("--slip-truth: only with --slip")
    try:
        injected = Slip.parse(slip, truth=slip_truth) if slip is not None else None
    except ValueError as exc:
        raise UserError(f"--slip: {exc}") from None
    config = GeneratorConfig(
        seed=seed,
        records=records,
        days=days,
        end_date=_parse_date(end_date, "--end-date"),
        bad_share=bad_share,
        drift=drift_kind,
        drift_magnitude=drift_magnitude,
        slip=injected,
    )
    raw_root = out or Path(cli_settings().zone("raw"))
    with _progress() as progress:
        task = progress.add_task("generating logs", total=records)
        summary = write_raw_logs(config, raw_root, compress=gzip_output, progress=lambda n: progress.advance(task, n))
    _emit(summary.to_dict(), as_json, f"wrote {summary.records} records to {raw_root}")


@logs_app.command("check")
def logs_check(
    path: Annotated[
        Path | None, typer.Argument(help="Raw zone folder or one JSONL file; default: the raw zone.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Schema-check raw logs and count the reasons lines would be quarantined."""
    from pipelines.logs.raw import check_files, raw_files

    target = path or Path(cli_settings().zone("raw"))
    if not target.exists():
        raise UserError(f"no such file or folder: {target}")
    files = [target] if target.is_file() else raw_files(target)
    if not files:
        raise UserError(f"no JSONL files under {target} (expected dt=YYYY-MM-DD/*.jsonl[.gz])")
    _emit(check_files(files).to_dict(), as_json, f"checked {len(files)} files")


@logs_app.command("import-webshop")
def logs_import_webshop(
    pairs_file: Annotated[Path, typer.Argument(help="WebShop instruction_to_query*.json")],
    day: Annotated[str, typer.Option("--date", help="Partition to write, YYYY-MM-DD.")],
    out: Annotated[Path | None, typer.Option(help="Raw zone folder; default: the configured raw zone.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn WebShop's human search queries into search_products turns in a raw partition."""
    from pipelines.simulate.importers import webshop_to_raw

    if not pairs_file.is_file():
        raise UserError(f"no such file: {pairs_file}")
    result = webshop_to_raw(pairs_file, out or Path(cli_settings().zone("raw")), _parse_date(day, "--date"))
    _emit(result, as_json, "WebShop import")


@logs_app.command("import-retail")
def logs_import_retail(
    tools_file: Annotated[Path, typer.Argument(help="tau-bench retail tools_openai_schema.json")],
    tasks_file: Annotated[Path, typer.Argument(help="tau-bench retail tasks_*.jsonl")],
    day: Annotated[str, typer.Option("--date", help="Partition to write, YYYY-MM-DD.")],
    out: Annotated[Path | None, typer.Option(help="Raw zone folder; default: the configured raw zone.")] = None,
    db: Annotated[
        Path | None,
        typer.Option(
            help="tau-bench's db.json: each task is its gold replay against the "
            "database (every result the tools' real answer; a task whose gold the database refuses is "
            "skipped and counted); default: db.json beside the tools file when there is one"
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Turn tau-bench retail tasks into turns under their own tool schemas (registered as a toolset)."""
    from pipelines.simulate.importers import retail_to_raw

    db = db or (tools_file.parent / "db.json" if (tools_file.parent / "db.json").is_file() else None)
    for f in (tools_file, tasks_file, *([db] if db else [])):
        if not f.is_file():
            raise UserError(f"no such file: {f}")
    result = retail_to_raw(
        tools_file, tasks_file, out or Path(cli_settings().zone("raw")), _parse_date(day, "--date"), db_file=db
    )
    _emit(result, as_json, "retail import")


@logs_app.command("schema")
def logs_schema(write: Annotated[bool, typer.Option(help="Rewrite the committed JSON Schema file.")] = False) -> None:
    """Print the log record's JSON Schema (or rewrite the committed file with --write)."""
    from pipelines.logs.schema import json_schema, write_json_schema

    if write:
        console.print(f"wrote {write_json_schema()}")
    else:
        sys.stdout.write(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


tools_app = typer.Typer(
    help="The tools agents call: our catalogue and imported toolsets, with their effects.", no_args_is_help=True
)


@tools_app.command("list")
def tools_list(as_json: JsonOpt = False) -> None:
    """Every registered tool (catalogue and toolsets) with its toolset, effect (read or write), identifier
    arguments and how far the grammar constrains it; a tool nobody declared is a write."""
    from pipelines.logs.tools import catalogue
    from pipelines.logs.toolsets import load_extra_tools, tools_table
    from pipelines.toolcall.grammar import constraint

    raw = cli_settings().zone("raw")
    rows = tools_table(raw)
    specs = catalogue(load_extra_tools(raw))
    for row in rows:
        row["constrained"] = constraint(row["tool"], specs.get(row["tool"], {}).get("function", {}).get("parameters"))
    if as_json:
        _emit({"tools": rows}, True, "")
        return
    for row in rows:
        ids = ", ".join(row["id_arguments"]) or "-"
        print(f"{row['tool']:<32} {row['toolset']:<10} {row['effect']:<6} ids: {ids:<24} grammar: {row['constrained']}")
