"""The flywheel's steps as plain functions of JSON-able inputs and outputs.

Airflow tasks, the CLI and the demo call these; each step is idempotent for its date window (it
replaces exactly that window's outputs), so a retry or a re-run of a date is safe.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

from pipelines.config import Settings, decoding_modes
from pipelines.errors import NotRetryable
from pipelines.window import DateWindow

SOURCES = ("synthetic", "landed")


def run_params(params: dict[str, Any], drift_events: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's parameters; a run started by drift alerts takes the newest alert's window, reason and
    reference (several alerts queued behind one run are served by that one run)."""
    if not drift_events:
        return dict(params)
    latest = max(drift_events, key=lambda e: e.get("checked_at", ""))
    return {
        **params,
        "source": "landed",
        "end_date": latest["end_date"],
        "window_days": latest["window_days"],
        "reason": latest["reason"],
        "reference_days": latest.get("reference_days") or [],
        "train": True,
        "drift_alerts": len(drift_events),
    }


def drift_check(settings: Settings, params: dict[str, Any]) -> dict[str, Any]:
    """The drift monitor on the latest window of raw logs (or the window ending `end_date`)."""
    from pipelines.drift.monitor import NoChampion, alert_of, run_monitor

    end = date.fromisoformat(str(params["end_date"])) if params.get("end_date") else None
    try:
        result = run_monitor(settings, end)
    except NoChampion as exc:  # nothing served yet: an hourly check that passes and says why (any other gap fails)
        return {
            "verdict": "no reference",
            "fire": False,
            "reason": str(exc),
            "window": None,
            "checked_at": None,
            "html_uri": None,
            "suppressed_by_cooldown": False,
            "alert": None,
        }
    return {
        k: result.get(k)
        for k in ("verdict", "fire", "reason", "window", "checked_at", "html_uri", "suppressed_by_cooldown")
    } | {"alert": alert_of(result, settings)}


def drift_alert_emitted(settings: Settings, checked: dict[str, Any]) -> dict[str, Any]:
    """After the alert's asset event went out: mark the check's alert emitted, which starts the cooldown
    (a check that fired but whose alert failed leaves no cooldown: the next check fires again)."""
    from pipelines.drift.monitor import mark_emitted

    return mark_emitted(settings, str(checked["checked_at"]))


def resolve_window(params: dict[str, Any], run_after: datetime | None = None) -> dict[str, str]:
    """The window a run processes: `end_date` (default: the last complete day) and `window_days` back."""
    end_value = params.get("end_date")
    if end_value:
        end = date.fromisoformat(str(end_value))
    else:
        end = ((run_after or datetime.now(UTC)) - timedelta(days=1)).date()
    window = DateWindow.ending(end, int(params.get("window_days") or 1))
    return {"start": window.start.isoformat(), "end": window.end.isoformat()}


def _window(window: dict[str, str]) -> DateWindow:
    return DateWindow.parse(window["start"], window["end"])


def ingest(settings: Settings, window: dict[str, str], params: dict[str, Any]) -> dict[str, Any]:
    """Land the window's raw logs: generate synthetic traffic, or check that the agent's logs landed."""
    from pipelines.prep.pipeline import PrepError, raw_files_for
    from pipelines.simulate.generator import Drift, GeneratorConfig, write_raw_logs

    w = _window(window)
    source = params.get("source", "synthetic")
    if source not in SOURCES:
        raise NotRetryable(f"source: expected one of {SOURCES}, got {source!r}")
    if source == "synthetic":
        days = len(w.days())
        cfg = GeneratorConfig(
            seed=int(params.get("seed") or int(w.end.strftime("%Y%m%d"))),
            records=int(params.get("records_per_day", 1500)) * days,
            days=days,
            end_date=w.end,
            bad_share=float(params.get("bad_share", 0.05)),
            drift=Drift(params.get("drift") or "none"),
            drift_magnitude=float(params.get("drift_magnitude", 0.6)),
        )
        summary = write_raw_logs(cfg, _local_path(settings.zone("raw")))
        return {"source": source, "records": summary.records, "files": summary.files, "kinds": summary.kinds}
    files = raw_files_for(settings, w)
    if not files:
        raise PrepError(f"no raw logs landed for {w} under {settings.zone('raw')}")
    return {"source": source, "files": files}


def _local_path(uri: str):  # the generator writes local files; on a cluster logs land from the agents
    from pathlib import Path

    if "://" in uri:
        raise NotRetryable("synthetic ingest writes to a local raw zone; on a cluster use source='landed'")
    return Path(uri)


def prep(settings: Settings, window: dict[str, str]) -> dict[str, Any]:
    from pipelines.prep.pipeline import run_prep

    return run_prep(settings, _window(window)).to_dict()


def base_context_window(settings: Settings, params: dict[str, Any] | None = None) -> int:
    """The context window of the base model the run's sweep trains (the quality gate's prompt ceiling): the
    run's `sweep` param, the drift sweep for a drift retrain, else the configured one; SmolLM2's when the
    sweep file cannot be read (the sweep task then says why)."""
    from pipelines.base_models import context_window
    from pipelines.config import ConfigError
    from pipelines.toolcall.budget import DEFAULT_CONTEXT_WINDOW

    try:
        return context_window(_run_sweep_config(params or {}, settings).base.base_model)
    except ConfigError:  # load_sweep says every unreadable sweep file this way
        return DEFAULT_CONTEXT_WINDOW


def validate(settings: Settings, window: dict[str, str], params: dict[str, Any] | None = None) -> dict[str, Any]:
    from pipelines.quality.gates import run_gates

    report = run_gates(settings, _window(window), context_window=base_context_window(settings, params))
    return {
        "success": report.success, "data_docs": report.data_docs, "result": report.result_uri,
        "signals": report.signals,
    }  # fmt: skip


def features(settings: Settings, window: dict[str, str]) -> dict[str, Any]:
    from pipelines.features.pipeline import run_features

    return run_features(settings, _window(window)).to_dict()


def _run_sweep_config(params: dict[str, Any], settings: Settings):
    """The sweep this run trains: the run's `sweep` param, else the drift sweep for a drift retrain,
    else the configured default."""
    from pipelines.train.sweep_config import load_sweep

    drift_run = bool(params.get("reference_days"))
    return load_sweep(
        params.get("sweep") or (settings.train.drift_sweep if drift_run else None) or settings.train.sweep,
        settings.train.backend,
    )


def train_pods(settings: Settings, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The `kubernetes` runner's plan: one pod manifest per sweep variant (none with the local runner,
    so the DAG's mapped `train_variant` task is skipped). Creates the sweep's parent run first, so
    the pods, running side by side, all log under it."""
    from pipelines.clients.mlflow import use_tracking
    from pipelines.cluster.training import variant_pod
    from pipelines.train.sweep import find_or_start_run, sweep_id_for
    from pipelines.train.sweep_config import variants

    if settings.train.runner != "kubernetes":
        return []
    sweep = _run_sweep_config(params, settings)
    window = _training_window(params, settings)
    sweep_id = sweep_id_for(settings, sweep, params.get("reference_days"), window)
    find_or_start_run(
        use_tracking(settings), {"flywheel.sweep_id": sweep_id, "flywheel.kind": "sweep"}, f"sweep {sweep.name}"
    )
    spec = sweep.model_dump(mode="json")
    return [
        variant_pod(
            settings,
            sweep=spec,
            sweep_id=sweep_id,
            index=index,
            gpus=sweep.gpus_per_variant,
            reference_days=params.get("reference_days"),
            window=window,
        )
        for index, _ in enumerate(variants(sweep))
    ]


def _training_window(params: dict[str, Any], settings: Settings) -> str | None:
    """The label of the run's window (`params["window"]`, set by the DAG), if its training set exists;
    None (the current manifest) when the caller gave no window."""
    window = params.get("window")
    if not window:
        return None
    return _window(window).label


def train(settings: Settings, params: dict[str, Any]) -> dict[str, Any]:
    """Run the LoRA sweep (`params["sweep"]` or the configured one) on the training set of the run's
    window (`params["window"]`; without one, the current manifest's); with the `kubernetes` runner,
    collect what the DAG's pods trained."""
    from pipelines.train.sweep import run_sweep

    drift_run = bool(params.get("reference_days"))
    sweep = _run_sweep_config(params, settings)
    result = run_sweep(
        settings, sweep, reference_days=params.get("reference_days"), window=_training_window(params, settings)
    )
    best = result.best_variant  # raises NotRetryable when every variant diverged
    return {
        "sweep_uri": result.uri,
        "sweep_id": result.sweep_id,
        "best_run_id": best.run_id,
        "adapter_dir": best.adapter_dir,
        "metrics": best.metrics,
        "drift_run": drift_run,
    }


def tune(settings: Settings, trained: dict[str, Any]) -> dict[str, Any]:
    """The tune stage after the sweep: the project's method (`flywheel project tune`, else `tune.method`) trains
    the sweep's best adapter further; off or skipped, the SFT adapter goes on."""
    import sys

    from pipelines.projects.registry import tune_method
    from pipelines.tune.stage import tune_stage

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return tune_stage(settings, trained, tune_method(settings), progress=say)


def evaluate(settings: Settings, trained: dict[str, Any]) -> dict[str, Any]:
    """Base zero-shot, base few-shot, the sweep's best adapter and the current champion, side by side."""
    from pipelines.evaluate.pipeline import Adapter, EvalConfig
    from pipelines.evaluate.pipeline import evaluate as run_eval
    from pipelines.registry.models import CHAMPION, adapter_path, alias_version, answer_budget, prompt_style
    from pipelines.storage import read_json
    from pipelines.toolcall.budget import FALLBACK

    sweep = read_json(trained["sweep_uri"])
    adapters = [Adapter("tuned_candidate", trained["adapter_dir"], sweep["prompt_style"])]
    if trained.get("sft_adapter_dir"):  # a tune method trained the candidate: the SFT adapter it started from too
        adapters.append(Adapter("tuned_sft", trained["sft_adapter_dir"], sweep["prompt_style"]))
    budgets = [sweep.get("answer_budget")]
    champion = alias_version(settings, CHAMPION)
    if champion is not None:
        adapters.append(Adapter("tuned_champion", adapter_path(settings, champion), prompt_style(settings, champion)))
        budgets.append(answer_budget(settings, champion) or FALLBACK)  # pre-budget versions are served at 64
    # every condition within the same budget: the largest the compared models learned (as served)
    max_new_tokens = settings.evaluation.max_new_tokens or max([b for b in budgets if b] or [FALLBACK])
    # a drift retrain needs candidate vs champion for the gate; the base-model baselines are the daily run's
    baselines = not (trained.get("drift_run") and champion is not None)
    if not settings.evaluation.baselines and settings.promotion.baseline == "none":
        baselines = False  # nothing compares with them: skipped on request (tests of other behaviour)
    ceiling = settings.evaluation.examples
    n = min(settings.evaluation.first_examples, ceiling)
    cfg = EvalConfig(
        base_model=sweep["base_model"],
        examples=n,
        shots=settings.evaluation.shots,
        baselines=baselines,
        window=sweep.get("window"),
        constrained=decoding_modes(settings.evaluation.constrained, settings.triton.constrained),
        grounded_ids=settings.triton.grounded_ids,
        max_new_tokens=max_new_tokens,
    )
    report = run_eval(settings, cfg, adapters, sweep["sweep_id"])
    _log_evaluation(settings, trained["best_run_id"], report)
    first = report
    rounds = [_sampling_round(settings, report, champion)]
    # undecided (the paired interval spans the margin): more requests, the two compared conditions only
    while rounds[-1]["decision"] == "undecided" and n < ceiling and report.examples >= n:
        n = min(2 * n, ceiling)
        only = ["tuned_candidate", "tuned_champion" if champion is not None else "base_few_shot"]
        only += ["tuned_sft"] if trained.get("sft_adapter_dir") else []  # what the tune method added, kept in view
        served = "on" if settings.triton.constrained else "off"
        report = run_eval(
            settings,
            cfg.model_copy(update={"examples": n, "only": only, "constrained": served}),
            adapters,
            f"{sweep['sweep_id']}-n{n}",
        )
        _log_evaluation(settings, trained["best_run_id"], report)
        rounds.append(_sampling_round(settings, report, champion))
    from pipelines.evaluate.pipeline import write_report

    report.settings["sample_rounds"] = rounds  # how many requests it took and why (`sampling` is how: stratified)
    write_report(settings, report)
    from pipelines.evaluate.episode_run import gate_episodes  # the episode rule, where episodes.tasks is set
    from pipelines.registry.episode_gate import episode_veto

    gated = [a for a in adapters if a.label != "tuned_sft"]  # the rule compares the candidate and its references
    ran = gate_episodes(settings, gated, sweep["base_model"], max_new_tokens, sweep["sweep_id"])
    episodes = ran and {"json_uri": ran["json_uri"], "html_uri": ran["html_uri"], "veto": episode_veto(ran, settings)}
    return {
        "episodes": episodes,
        "json_uri": report.json_uri,
        "html_uri": report.html_uri,
        "table": report.table(),
        "champion_version": champion,
        "first_report": first.html_uri,
        "sampling": rounds,
    }


def _sampling_round(settings: Settings, report: Any, champion: str | None) -> dict[str, Any]:
    """The gate's view of one evaluation (the registry gate itself decides after registration): whether the
    paired interval already decides, on how many requests."""
    from pipelines.registry.gate import BASELINE, gate
    from pipelines.registry.models import evaluation_rows, served_rows

    rows, _ = served_rows(settings, evaluation_rows({"json_uri": report.json_uri, "table": report.table()}))
    if "tuned_candidate" not in rows:
        return {"examples": report.examples, "decision": "n/a", "reason": "no candidate row"}
    verdict = gate(
        rows["tuned_candidate"],
        rows.get("tuned_champion") if champion is not None else None,
        settings,
        rows.get(BASELINE),
    )
    return {"examples": report.examples, "decision": verdict.decision, "reason": verdict.reason}


def _log_evaluation(settings: Settings, run_id: str, report: Any) -> None:
    import mlflow
    from pipelines.clients.mlflow import use_tracking

    use_tracking(settings)
    with mlflow.start_run(run_id=run_id):
        for row in report.table():
            mlflow.log_metrics(
                {
                    f"test_{row['condition']}_{k}": float(v)
                    for k, v in row.items()
                    if isinstance(v, (int, float)) and v is not None
                }
            )
        mlflow.log_artifact(report.json_uri.removeprefix("file://"), "evaluation")
        mlflow.log_artifact(report.html_uri.removeprefix("file://"), "evaluation")


def register(settings: Settings, trained: dict[str, Any], evaluated: dict[str, Any]) -> dict[str, Any]:
    from pipelines.registry.models import register as register_version
    from pipelines.storage import read_json

    return register_version(settings, read_json(trained["sweep_uri"]), evaluated, trained.get("tune"))


def promote(
    settings: Settings, registered: dict[str, Any], evaluated: dict[str, Any], params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The promotion gate on the evaluation's numbers for exactly the version `register` returned:
    against the champion evaluated on the same requests, or with none, the base few-shot row. The
    result's `reason` is one line; not promoted leaves `champion` (and so serving) as it is."""
    from pipelines.registry.gate import SFT, sft_veto
    from pipelines.registry.models import evaluation_rows, served_rows
    from pipelines.registry.models import promote as gate_and_promote

    rows = evaluation_rows(evaluated)
    for condition in ("tuned_champion", "tuned_champion_constrained"):
        if condition in rows and evaluated.get("champion_version"):
            rows[condition]["version"] = str(evaluated["champion_version"])
    reason = (params or {}).get("reason")
    veto = (evaluated.get("episodes") or {}).get("veto")  # the episode rule's refusal (registry.episode_gate)
    served, _ = served_rows(settings, rows)
    tuned = sft_veto(served["tuned_candidate"], served.get(SFT), settings)  # a tune method's result vs its SFT
    veto = "; ".join(v for v in (veto, tuned) if v) or None
    decision = gate_and_promote(settings, rows, str(registered["version"]), f"[{reason}] " if reason else "", veto=veto)
    return decision.to_dict()


def should_deploy(promoted: dict[str, Any], params: dict[str, Any]) -> bool:
    """Deploy when asked to and there is a champion to serve: the one just promoted, or the current one
    (deploy keeps it live, reloading it after a server restart). Nothing promoted and no champion yet:
    serving stays as it is (the gate's one-line reason is the promote task's result)."""
    if not params.get("deploy", True):
        return False
    return bool(promoted.get("promoted")) or promoted.get("champion_version") is not None


def deploy(settings: Settings, promoted: dict[str, Any]) -> dict[str, Any]:
    """Put the champion behind Triton (load, smoke test, switch); a no-op when it is already live."""
    from pipelines.serve.deploy import deploy as put_live

    return {**put_live(settings, "champion"), "promoted": bool(promoted.get("promoted"))}


def smoke_test(settings: Settings, deployed: dict[str, Any]) -> dict[str, Any]:
    """After the switch: the live model answers real requests through the client; otherwise roll back."""
    from pipelines.serve import deploy as serving
    from pipelines.serve.client import TritonClient

    live = serving.live_model(settings)
    if live is None:
        raise NotRetryable("no live model after deployment")
    client = TritonClient(settings)
    try:
        result = serving.smoke_test(settings, client, live)
    finally:
        client.close()
    failure = serving.smoke_failure(settings, result)
    if failure:
        try:  # only while it is still the live one: a deploy in between is not undone
            outcome = f"rolled back to {serving.rollback(settings, only_if_live=live.name)['live']['name']}"
        except serving.DeployFailed as exc:
            outcome = str(exc)
        raise NotRetryable(f"{live.name} failed the post-deployment smoke test ({failure}); {outcome}")
    return {"live": live.name, "version": live.version, **result}


def benchmark(settings: Settings, smoked: dict[str, Any]) -> dict[str, Any]:
    """Latency, throughput, tokens and cost of the live model against base + few-shot (HTML + JSON + MLflow)."""
    from pipelines.bench.serving import run_bench

    if not settings.bench.after_deploy:
        return {"live": smoked.get("live"), "version": smoked.get("version"), "skipped": "bench.after_deploy is off"}
    report = run_bench(settings)
    return {k: report[k] for k in ("live", "version", "comparison", "json_uri", "html_uri", "triton_overhead_ms")}
