"""The data path: prep, validate, features, and `flywheel run` (the whole DAG)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from pipelines.cli.common import DaysOpt, EndOpt, JsonOpt, UserError, cli_settings, console
from pipelines.cli.common import emit as _emit
from pipelines.cli.common import parse_date as _parse_date
from pipelines.cli.common import window_arg as _window_arg
from pipelines.security import redact_uri

app = typer.Typer()  # this module's top-level commands (merged into `flywheel`)


features_app = typer.Typer(
    help="Feast: compute, register and materialize features; look up context.", no_args_is_help=True
)


@app.command("prep")
def prep_cmd(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Spark prep of a window: quarantine with reasons, redact PII, dedupe, SFT examples, splits, manifest."""
    from pipelines import tasks

    with console.status("Spark prep ..."):
        result = tasks.prep(cli_settings(), _window_arg(end_date, window_days))
    _emit(result, as_json, result["message"])


@app.command("validate")
def validate_cmd(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Great Expectations gates on the window's raw logs and curated examples (exit 1 when a gate fails)."""
    from pipelines.quality.gates import run_gates
    from pipelines.tasks import base_context_window
    from pipelines.window import DateWindow

    w = _window_arg(end_date, window_days)
    settings = cli_settings()
    with console.status("Great Expectations ..."):
        report = run_gates(
            settings,
            DateWindow.parse(w["start"], w["end"]),
            raise_on_failure=False,
            context_window=base_context_window(settings),
        )
    _emit(
        {
            "success": report.success,
            "failures": report.failures,
            "data_docs": report.data_docs,
            "result": report.result_uri,
            "quarantined_to": report.quarantined_to,
            "signals": report.signals,
        },
        as_json,
        "quality gates",
    )
    if not report.success:
        raise typer.Exit(1)


@features_app.command("apply")
def features_apply(as_json: JsonOpt = False) -> None:
    """Register the entities, feature views and feature service of feature_repo/ in the Feast registry."""
    from pipelines.clients import feast

    _emit({"applied": feast.apply(cli_settings())}, as_json, "feast apply")


@features_app.command("materialize")
def features_materialize(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Compute the window's feature snapshots (Spark), register them, and load them into the online store."""
    from pipelines.clients import feast
    from pipelines.features.pipeline import compute_features, materialize_window
    from pipelines.window import DateWindow

    settings = cli_settings()
    w = _window_arg(end_date, window_days)
    window = DateWindow.parse(w["start"], w["end"])
    with console.status("computing features ..."):
        customers, categories = compute_features(settings, window)
        feast.apply(settings)
        materialize_window(settings, window)
    _emit(
        {
            "customer_rows": customers,
            "category_rows": categories,
            "online_store": redact_uri(settings.feast.online_store),
        },
        as_json,
        "feast materialize",
    )


@features_app.command("build")
def features_build(end_date: EndOpt = None, window_days: DaysOpt = 1, as_json: JsonOpt = False) -> None:
    """Compute, apply, materialize, and write the training set with point-in-time customer context."""
    from pipelines import tasks

    with console.status("features ..."):
        result = tasks.features(cli_settings(), _window_arg(end_date, window_days))
    _emit(result, as_json, "features")


@features_app.command("context")
def features_context(customer_id: Annotated[str, typer.Argument(help="e.g. cus_0000042")]) -> None:
    """Print a customer's prompt context from the online store (what serving adds to the prompt)."""
    from pipelines.features.pipeline import online_context

    sys.stdout.write((online_context(customer_id, cli_settings()) or "(no context)") + "\n")


@app.command("run")
def run_cmd(
    end_date: EndOpt = None,
    window_days: DaysOpt = 1,
    records_per_day: Annotated[int, typer.Option(min=1, help="Synthetic records per day.")] = 1500,
    source: Annotated[
        str | None,
        typer.Option(
            help="synthetic (generate traffic) or landed (the agent's logs); "
            "default: synthetic for the default project, landed in a project"
        ),
    ] = None,
    bad_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of generated lines that are broken on purpose (quarantine).")
    ] = 0.05,
    drift: Annotated[str, typer.Option(help="none, holiday, new-category, locale, tool-mix")] = "none",
    seed: Annotated[int, typer.Option(help="0: derived from the date")] = 0,
    scheduler: Annotated[
        bool, typer.Option(help="Trigger through the running scheduler (REST) instead of `airflow dags test`.")
    ] = False,
    train: Annotated[bool, typer.Option(help="Train, evaluate, register and promote after the data path.")] = True,
    sweep: Annotated[str | None, typer.Option(help="Sweep file (default: train.sweep in the config).")] = None,
    deploy: Annotated[bool, typer.Option(help="Deploy the champion to Triton, smoke-test and benchmark it.")] = True,
    as_json: JsonOpt = False,
) -> None:
    """Run the commerce_flywheel DAG for a window (in-process `dags test`, or via `flywheel up`'s scheduler)."""
    from pipelines.airflow_tasks import dag_id_for
    from pipelines.config import DEFAULT_PROJECT

    source = source or ("synthetic" if cli_settings().project == DEFAULT_PROJECT else "landed")
    conf = {
        "end_date": end_date,
        "window_days": window_days,
        "records_per_day": records_per_day,
        "source": source,
        "bad_share": bad_share,
        "drift": drift,
        "seed": seed,
        "train": train,
        "sweep": str(Path(sweep).resolve()) if sweep else None,
        "deploy": deploy,
    }
    if end_date:
        _parse_date(end_date, "--end-date")
    settings = cli_settings()
    dag_id = dag_id_for("commerce_flywheel", settings.project)  # the project's own DAG
    if scheduler:
        _run_on_the_scheduler(settings, dag_id, conf, as_json)
    else:
        _run_in_process(settings, dag_id, conf, as_json)


def _run_on_the_scheduler(settings: Any, dag_id: str, conf: dict[str, Any], as_json: bool) -> None:
    """Trigger the DAG through the running scheduler's REST API and wait for the run's end."""
    from pipelines.airflow_tasks import failure_of
    from pipelines.clients import airflow

    rest = airflow.AirflowRest(settings)
    limit = settings.airflow.run_timeout_s
    with console.status("waiting for the DAG run ..."):
        state = airflow.trigger_and_wait(rest, dag_id, conf, timeout_s=limit)
    if state["state"] == "timeout":
        raise UserError(
            f"{dag_id} run {state['dag_run_id']} did not finish within {limit:g} s "
            f"(airflow.run_timeout_s); it goes on in the scheduler: see {airflow.base_url(settings)}"
        )
    _emit(state, as_json, f"{dag_id}: {state['state']}")
    if state["state"] != "success":
        _fail(
            failure_of(settings.zone("reports"), dag_id, run_id=state["dag_run_id"]),
            f"{airflow.base_url(settings)}/dags/{dag_id}",
        )


def _run_in_process(settings: Any, dag_id: str, conf: dict[str, Any], as_json: bool) -> None:
    """`airflow dags test`: the run in this process's children, each task printed as it ends."""
    from pipelines.airflow_tasks import RUN_TOKEN, failure_of
    from pipelines.progress import follower, progress_line
    from pipelines.projects import airflow_access
    from pipelines.stack import airflow as airflow_server

    log = (
        Path(str(settings.root))
        / "logs"
        / ("dags-test.log" if dag_id == "commerce_flywheel" else f"dags-test-{dag_id}.log")
    )
    token = uuid.uuid4().hex  # the tasks of this run record it with their failure: no other run's is shown
    follow = follower(settings.zone("reports"), token, lambda r: console.print(progress_line(r), highlight=False))
    with console.status(f"airflow dags test {dag_id} (log: {log}) ..."):
        bundle = airflow_access.bundle_name(settings.project) if airflow_access.prepare(settings) else None
        result = airflow_server.dags_test(
            settings, dag_id, conf, log=log, extra_env={RUN_TOKEN: token}, bundle=bundle, on_wait=follow
        )
    ok = result.returncode == 0 and "state=success" in result.stdout + result.stderr
    failure = None if ok else failure_of(settings.zone("reports"), dag_id, token=token)
    _emit(
        {
            "state": "success" if ok else "failed",
            "log": str(log),
            **({"failed_task": failure["task"], "reason": failure["reason"]} if failure else {}),
        },
        as_json,
        dag_id,
    )
    if not ok:
        _fail(failure, str(log))


def _fail(failure: dict | None, where: str) -> None:
    """One line: which task failed and why (a gate: suite, expectation, failing count, Data Docs); exit 2 for a
    data problem the user can fix, 1 for anything else."""
    why = f"task {failure['task']} failed: {failure['reason']}" if failure else "a task failed (see the log)"
    sys.stderr.write(f"error: {why} (log: {where})\n")
    raise typer.Exit(2 if failure and failure["data_problem"] else 1)


labels_app = typer.Typer(
    help="Labels you can trust: the review queue of down-rated answers, and the preference pairs.", no_args_is_help=True
)


@labels_app.command("review")
def labels_review(as_json: JsonOpt = False) -> None:
    """Down-rated answers nobody has decided yet (they never train; a correction becomes a `human` label)."""
    from pipelines.prep.reviews import queue

    waiting = queue(cli_settings())
    if as_json:
        _emit({"queue": waiting}, True, "")
        return
    if not waiting:
        print("the review queue is empty")
    for r in waiting:
        print(
            f"{r['record_id']}  {r['at'][:19]}  {r['label_source']:<9} {r['request'][:70]!r} -> "
            f"{r['tool']} {r['arguments'] or ''}"
        )


@labels_app.command("accept")
def labels_accept(
    record_id: Annotated[str, typer.Argument(help="A queued record id")],
    call: Annotated[
        str,
        typer.Option(
            help='The corrected call: \'{"name": ..., "arguments": {...}}\' (or \'{"name": null}\': no tool fits)'
        ),
    ],
    reviewer: Annotated[str, typer.Option(help="Who decided (recorded with the decision)")] = "reviewer",
    as_json: JsonOpt = False,
) -> None:
    """Accept a queued turn with the corrected call: written to the raw zone as a `human` label."""
    import json

    from pipelines.prep.reviews import decide

    try:
        parsed = json.loads(call)
    except json.JSONDecodeError as exc:
        raise UserError(f"--call is not JSON: {exc}") from None
    _emit(decide(cli_settings(), record_id, True, parsed, reviewer), as_json, "review")


@labels_app.command("reject")
def labels_reject(
    record_id: Annotated[str, typer.Argument(help="A queued record id")],
    reviewer: Annotated[str, typer.Option(help="Who decided")] = "reviewer",
    as_json: JsonOpt = False,
) -> None:
    """Reject a queued turn: it stays out of training and leaves the queue."""
    from pipelines.prep.reviews import decide

    _emit(decide(cli_settings(), record_id, False, None, reviewer), as_json, "review")


@labels_app.command("relabel")
def labels_relabel(
    limit: Annotated[int, typer.Option(min=1, help="Ask the teacher about at most this many queued turns")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """The teacher (gateway.teacher_url) answers the queued turns our own model answered: each call it makes that
    the turn allows becomes a `teacher` label (the chosen side of a `relabel` preference pair); the rest stay in
    the queue for a person, counted by reason."""
    from pipelines.clients.teacher import TeacherClient, TeacherError
    from pipelines.prep.reviews import relabel

    settings = cli_settings()
    try:
        result = relabel(settings, TeacherClient.from_settings(settings), limit)
    except TeacherError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        _emit(result, True, "")
        return
    print(f"the teacher relabelled {result['relabelled']} of {result['asked']} queued turn(s) our model answered")
    for reason, n in result["left_for_a_person"].items():
        print(f"  left for a person: {n}  {reason}")


@labels_app.command("pairs")
def labels_pairs(
    show: Annotated[int, typer.Option(min=0, help="List this many pairs after the counts")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """The preference pairs the platform has collected, by source and split: corrections (the person's call over
    the original answer), teacher relabels (the teacher's call over our model's down-rated answer), shadow and
    canary disagreements (the teacher's call over the candidate's) and offline shadow runs (the gold over our
    model's wrong answer), with what was dropped or quarantined and why."""
    from pipelines.prep.pairs import collect_pairs, pair_summary

    pairs, dropped, quarantined = collect_pairs(cli_settings())
    summary = pair_summary(pairs, dropped, quarantined)
    if as_json:
        _emit({**summary, "shown": pairs.head(show).to_dict("records")}, True, "")
        return
    print(f"{summary['pairs']} preference pair(s)")
    _print_counts(summary)
    for row in pairs.head(show).to_dict("records"):
        print(f"{row['pair_id']}  [{row['split']}]  chosen {row['chosen_json']}  over  {row['rejected_json']}")


@labels_app.command("thumbs")
def labels_thumbs(
    show: Annotated[int, typer.Option(min=0, help="List this many rated answers after the counts")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """The unpaired thumbs KTO trains on, by source and split: answers rated up and corrections (desirable),
    answers rated down (undesirable), with what was dropped or quarantined and why."""
    from pipelines.prep.thumbs import collect_thumbs, thumb_summary

    thumbs, dropped, quarantined = collect_thumbs(cli_settings())
    summary = thumb_summary(thumbs, dropped, quarantined)
    if as_json:
        _emit({**summary, "shown": thumbs.head(show).to_dict("records")}, True, "")
        return
    print(
        f"{summary['thumbs']} rated answer(s); training split: {summary['train_desirable']} desirable, "
        f"{summary['train_undesirable']} undesirable"
    )
    _print_counts(summary)
    for row in thumbs.head(show).to_dict("records"):
        kind = "desirable" if row["desirable"] else "undesirable"
        print(f"{row['thumb_id']}  [{row['split']}]  {kind}  {row['completion_json']}")


def _print_counts(summary: dict[str, Any]) -> None:
    """A signal table's counts by source and split, then what was dropped and quarantined, with why."""
    for source, splits in summary["by_source"].items():
        counts = ", ".join(f"{split} {n}" for split, n in sorted(splits.items())) or "none"
        print(f"  {source:<10} {counts}")
    for title, counts in (("dropped", summary["dropped"]), ("quarantined", summary["quarantined"])):
        for reason, n in counts.items():
            print(f"  {title}: {n}  {reason}")
