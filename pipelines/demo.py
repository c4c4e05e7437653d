"""`flywheel demo`: the whole flywheel on embedded defaults, narrated, with every output's location."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from pipelines.config import Settings
from pipelines.security import redact_uri
from pipelines.stack import airflow as airflow_server
from pipelines.storage import read_json


class DemoFailed(RuntimeError):
    """A demo step failed; the message says which and where its log is."""


def _latest_evaluation(settings: Settings) -> dict | None:
    """The newest evaluation with every condition (a round the gate asked for, on more requests, re-runs only
    the two it compares: its sample size is shown from the report's `sampling` record instead)."""
    reports = sorted(
        Path(settings.zone("reports"), "evaluation").glob("*/report.json"), key=lambda p: p.stat().st_mtime
    )
    whole = [r for r in (read_json(str(p)) for p in reports) if not (r.get("settings") or {}).get("only")]
    return whole[-1] if whole else None


def _dags_test(
    settings: Settings,
    dag_id: str,
    conf: dict,
    extra_env: dict[str, str] | None = None,
    on_wait: Any = None,
) -> Any:
    """`airflow dags test` within `airflow.run_timeout_s`; a timeout is one clear error naming the running task
    (`RunTimedOut`). `on_wait`: called about every second while it runs."""
    from pipelines.projects import airflow_access

    airflow_access.prepare(settings)  # airflow.multi_team: the bundles and teams first
    return airflow_server.dags_test(settings, dag_id, conf, extra_env=extra_env, on_wait=on_wait)


def _require_a_champion(settings: Settings) -> None:
    """The demo promises a served tuned model: if the gate refused the candidate (it was not better than
    base + few-shot), say so in one line with the gate's reason instead of "demo finished"."""
    import json

    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.registry.models import CANDIDATE, CHAMPION, GATE_TAG, alias_version

    if alias_version(settings, CHAMPION) is not None:
        return
    candidate = alias_version(settings, CANDIDATE)
    reason = "no candidate was registered"
    if candidate is not None:
        tag = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, candidate).tags.get(GATE_TAG)
        reason = json.loads(tag).get("reason", "no gate decision recorded") if tag else "no gate decision recorded"
    raise DemoFailed(f"the promotion gate kept the tuned model out of serving ({reason}); nothing was deployed")


def _latest_bench(settings: Settings) -> dict | None:
    latest = Path(settings.zone("reports"), "bench", "latest.json")
    return read_json(str(latest)) if latest.is_file() else None


def _heading(console: Console, text: str) -> None:
    """A rule across a terminal; one plain line elsewhere (without a terminal lines are as wide as their text)."""
    if console.is_terminal:
        console.rule(text)
    else:
        console.print(f"== {text} ==", soft_wrap=True)


def run_demo(settings: Settings, *, records_per_day: int, days: int, seed: int, console: Console) -> dict[str, str]:
    """The commerce_flywheel DAG on `days` of generated traffic, each task printed as it ends; then what it made:
    the data, the evaluation, the serving comparison, one request through the gateway, and where everything is."""
    started = time.perf_counter()
    end = (datetime.now(UTC) - timedelta(days=1)).date()
    conf = {
        "end_date": end.isoformat(),
        "window_days": days,
        "records_per_day": records_per_day,
        "source": "synthetic",
        "seed": seed,
    }
    _heading(console, f"commerce_flywheel DAG: {days} days of traffic ending {end} ({records_per_day}/day)")
    log = _run_the_dag(settings, conf, console)
    manifest = _print_the_data(settings, console)
    evaluation = _print_the_evaluation(settings, console)
    _require_a_champion(settings)
    from pipelines.serve.deploy import live_model

    live = live_model(settings)
    bench = _print_the_serving_comparison(settings, live, console)
    gateway_url = _ask_the_gateway(settings, end, seed, console) if live is not None else None
    outputs = _outputs(settings, manifest, log, evaluation, bench, gateway_url)
    # at most 100 columns wide (a long path folds onto a second line), whatever the console's width
    table = Table(title=f"demo finished in {time.perf_counter() - started:.0f} s", width=min(100, console.width))
    table.add_column("output", no_wrap=True)
    table.add_column("where (paths relative to the project root)", overflow="fold")
    for name, where in outputs.items():
        table.add_row(name, where)
    console.print(table)
    console.print(
        "Next: `flywheel up` for the Airflow (http://127.0.0.1:8080) and MLflow (http://127.0.0.1:5000) "
        "UIs; `flywheel registry list`; `flywheel features context <customer_id>` for the online context."
    )
    console.print(f"the gate: {gate_decision(settings)}", soft_wrap=True, highlight=False)
    return outputs


def _run_the_dag(settings: Settings, conf: dict[str, Any], console: Console) -> Path:
    """`airflow dags test` of the DAG, one line per task as it ends (task, seconds, its key figure); its log kept."""
    import uuid

    from pipelines.airflow_tasks import RUN_TOKEN
    from pipelines.progress import follower, progress_line

    console.print(
        "ingest -> Spark prep -> Great Expectations gates -> Feast features -> LoRA sweep on "
        "SmolLM2-135M -> evaluation -> MLflow registry -> promotion gate -> Triton deploy -> smoke test "
        "-> benchmark (airflow dags test); each task as it ends:"
    )
    token = uuid.uuid4().hex
    follow = follower(settings.zone("reports"), token, lambda r: console.print(progress_line(r), highlight=False))
    with console.status("running the DAG (most of it LoRA training, evaluation and the benchmark on the CPU) ..."):
        result = _dags_test(settings, "commerce_flywheel", conf, extra_env={RUN_TOKEN: token}, on_wait=follow)
    log = Path(str(settings.root)) / "logs" / "demo-dags-test.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0 or "state=success" not in result.stdout + result.stderr:
        raise DemoFailed(f"the commerce_flywheel DAG run failed; see {_relative(str(log))}")
    return log


def _print_the_data(settings: Settings, console: Console) -> dict[str, Any]:
    """What prep made of the records: kept, quarantined (why), redacted, split."""
    manifest = read_json(f"{settings.zone('curated')}/manifest.json")
    counts = manifest["counts"]
    console.print(
        f"records in: {counts['input']:,}  ->  examples: {counts['clean']:,}, quarantined: "
        f"{counts['quarantined']:,}, duplicates: {counts['duplicates']:,}, held (labels that do not train): "
        f"{counts.get('held', 0):,} (reconciled: {counts['reconciled']})"
    )
    console.print(f"quarantine reasons: {manifest['quarantine_reasons']}")
    console.print(f"PII redacted: {manifest['redactions']}")
    console.print(
        f"splits: {manifest['examples_by_split']}; with customer context: "
        f"{manifest['training_set']['with_customer_context']:,}"
    )
    return manifest


def _print_the_evaluation(settings: Settings, console: Console) -> dict[str, Any] | None:
    """The evaluation's conditions side by side (the newest evaluation with every condition)."""
    evaluation = _latest_evaluation(settings)
    if not evaluation:
        return None
    table = Table(
        title=f"tool-calling evaluation on {evaluation['examples']} test requests "
        "(grammar: decoded under the offered tools' schemas)"
    )
    for column in ("condition", "decoding", "exact", "name acc.", "arg F1", "text F1", "prompt tok.", "p50 ms"):
        table.add_column(column)
    for c in evaluation["conditions"]:
        s = c["summary"]
        table.add_row(
            c["condition"].removesuffix("_constrained"),
            "grammar" if c.get("constrained") else "free",
            f"{s['exact_match']:.3f}",
            f"{s['name_accuracy']:.3f}",
            f"{s['arg_f1'] or 0:.3f}",
            "n/a" if s.get("text_f1") is None else f"{s['text_f1']:.3f}",
            f"{c['stats']['prompt_tokens_mean']:.0f}",
            f"{c['stats']['latency_ms_p50']:.0f}",
        )
    console.print(table)
    return evaluation


def _print_the_serving_comparison(settings: Settings, live: Any, console: Console) -> dict[str, Any] | None:
    """The serving benchmark of the live model (this run's), as a table a terminal has room for."""
    bench = _latest_bench(settings)
    if bench and (live is None or bench.get("live") != live.name):  # an older run's figures are not this run's
        why = "bench.after_deploy is off" if not settings.bench.after_deploy else "the last one measured another model"
        console.print(
            f"no serving benchmark of {live.name if live else 'a live model'} ({why}): `flywheel bench` runs it",
            soft_wrap=True,
        )
        return None
    if not bench:
        return None
    console.print(_bench_table(bench))
    change = bench["comparison"]
    if change:
        from pipelines.bench.report import change_line

        console.print(
            f"tuned vs base + few-shot ({'grammar' if bench.get('constrained') else 'free'} decoding, "
            f"as served): latency p50 {change_line(change)}, prompt tokens "
            f"{change['prompt_tokens_change']:+.0%}, throughput {change['throughput_change']:+.0%}"
        )
    return bench


def _bench_table(bench: dict[str, Any]) -> Table:
    from pipelines.bench.results import TABLE_COLUMNS, table_rows

    table = Table(
        title=f"served by Triton ({bench['hardware']['name']}): {bench['live']} vs {bench['baseline']}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=0,
    )
    # the columns a terminal has room for, whole milliseconds (the HTML report has them all)
    keep = [i for i, c in enumerate(TABLE_COLUMNS) if c not in ("requests", "p95 ms", "p99 ms", "$/M req")]
    rows = []
    for row in table_rows(bench):
        row[0] = row[0].split(" (")[0].replace(" in-process", " in-proc.")  # "tuned v1 (names prompt)" -> "tuned v1"
        cells = {TABLE_COLUMNS[i]: row[i] for i in keep}
        for column in ("TTFT ms", "ITL ms", "p50 ms", "prompt tokens"):
            if cells[column] != "n/a":
                cells[column] = f"{float(cells[column]):.0f}"
        rows.append(list(cells.values()))
    for n, i in enumerate(keep):  # cells keep their width; headers wrap
        table.add_column(TABLE_COLUMNS[i], min_width=max(len(r[n]) for r in rows), no_wrap=n == 0)
    for values in rows:
        table.add_row(*values)
    return table


def _relative(where: str) -> str:
    """A path under the project root (the working folder) as a relative one, so the closing table fits."""
    path = where.removeprefix("file://")
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return where


def _outputs(
    settings: Settings,
    manifest: dict[str, Any],
    log: Path,
    evaluation: dict[str, Any] | None,
    bench: dict[str, Any] | None,
    gateway_url: str | None,
) -> dict[str, str]:
    """Where each output of the run is, relative to the project root where it lies under it."""
    rel = _relative
    outputs = {
        "raw logs": rel(settings.zone("raw")),
        "curated SFT Parquet": rel(manifest["training_set"]["uri"]),
        "manifest (lineage)": rel(f"{settings.zone('curated')}/manifest.json"),
        "quarantine table": rel(f"{settings.zone('quarantine')}/records"),
        "Data Docs": rel(f"{settings.zone('reports')}/quality/gx/uncommitted/data_docs/local_site/index.html"),
        "Feast registry": rel(str(redact_uri(settings.feast.registry))),
        "DAG log": rel(str(log)),
        "MLflow runs and registry": "http://127.0.0.1:5000 after `flywheel up` (store: "
        f"{rel(str(redact_uri(settings.mlflow.tracking_uri)).removeprefix('sqlite:///'))})",
    }
    if evaluation:
        outputs["evaluation report"] = rel(evaluation["html_uri"])
    if bench:
        outputs["serving benchmark report"] = rel(bench["html_uri"])
        outputs["Triton (champion live)"] = f"http://{settings.triton.host}:{settings.triton.http_port}"
    if gateway_url:
        outputs["OpenAI-compatible gateway"] = f"{gateway_url} (`flywheel gateway status`)"
    return outputs


def _ask_the_gateway(settings: Settings, day: Any, seed: int, console: Console) -> str:
    """Start the OpenAI-compatible gateway and send it one shopper request with the official `openai`
    client, as an agent would; print the lines a user copies (the key stays in its file)."""
    import orjson
    from openai import OpenAI

    from pipelines.gateway import app as gateway
    from pipelines.simulate.generator import GeneratorConfig, TrafficGenerator

    _heading(console, "the agent's front door: the OpenAI API")
    gateway.up(settings)
    url, key_file = gateway.base_url(settings), gateway.api_key_file(settings)
    record = orjson.loads(
        next(TrafficGenerator(GeneratorConfig(seed=seed + 7, records=1, bad_share=0.0, end_date=day)).lines())[1]
    )
    client = OpenAI(
        base_url=url, api_key=gateway.api_key(settings), timeout=settings.gateway.request_timeout_s, max_retries=1
    )
    answer = client.chat.completions.create(
        model="champion",
        messages=record["request"]["messages"],
        tools=record["request"]["tools"],
        user=record["customer_id"],
    )
    message = answer.choices[0].message
    call = message.tool_calls[0] if message.tool_calls else None
    if call is not None and call.type != "function":  # the gateway answers function calls only
        raise DemoFailed(f"the gateway answered a {call.type} tool call, not a function call")
    said = f"{call.function.name}({call.function.arguments})" if call is not None else f"no tool: {message.content!r}"
    console.print(f"request: {record['request']['messages'][-1]['content']!r}")
    if answer.usage is None:  # the gateway reports every completion's usage
        raise DemoFailed("the gateway's answer has no token usage")
    console.print(
        f"champion answered: {said} ({answer.usage.prompt_tokens} prompt tokens; captured into the raw "
        f"zone as tomorrow's training data)"
    )
    console.print(
        f'curl {url}/chat/completions -H "Authorization: Bearer $(cat {key_file})" '
        f'-H \'Content-Type: application/json\' -d \'{{"model": "champion", "messages": [{{"role": '
        f'"user", "content": "track order ORD-123456"}}], "tools": [...]}}\'',
        soft_wrap=True,
    )
    console.print(
        f'python: OpenAI(base_url="{url}", api_key=open("{key_file}").read().strip())'
        f'.chat.completions.create(model="champion", messages=..., tools=...)',
        soft_wrap=True,
    )
    return url


def gate_decision(settings: Settings) -> str:
    """The newest version's gate decision with its reason, as the registry recorded it (`flywheel.gate`)."""
    import json

    from pipelines.clients.mlflow import client as mlflow_client

    client = mlflow_client(settings)
    versions = client.search_model_versions(f"name='{settings.mlflow.registered_model}'")
    newest = max(versions, key=lambda v: int(v.version))
    gate = json.loads(newest.tags.get("flywheel.gate", "{}") or "{}")
    verdict = "promoted" if gate.get("promoted") else "not promoted (the champion stays)"
    return f"v{newest.version} {verdict}: {gate.get('reason', '')}".strip()
