"""The checks of bench/projects.py, each against the running platform: a project's key and its viewer reach
its own models and runs only (through the `openai` client and MLflow's REST API), Airflow shows a project's
DAGs to its members only, which Triton models serve, and a drift in one project retrains that project only."""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import date, timedelta
from pathlib import Path
from typing import Any

DAY = "2026-11-20"
SEED = 7


def requests_of(raw_zone: Path, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` chat requests replayed from a project's own raw zone (its messages up to the call, its tools)."""
    records = []
    for path in sorted(raw_zone.glob("dt=*/*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                records.append(
                    {
                        "messages": record["request"]["messages"],
                        "tools": record["request"]["tools"],
                        "user": record.get("customer_id") or "anonymous",
                    }
                )
            except (ValueError, KeyError, TypeError):
                continue  # the bad records the generator writes on purpose
    random.Random(seed).shuffle(records)
    return records[:n]


def isolation(url: str, keys: dict[str, str], root: Path) -> dict[str, Any]:
    """Each key gets its project's champion and is refused the other's model; a viewer of shop reads shop's runs
    in MLflow and not search's."""
    import httpx
    from openai import NotFoundError, OpenAI

    out: dict[str, Any] = {}
    clients = {p: OpenAI(base_url=url, api_key=k, max_retries=0, timeout=180) for p, k in keys.items()}
    listed = {p: {m.id: m.root for m in c.models.list().data} for p, c in clients.items()}  # type: ignore[attr-defined]
    out["models"] = listed
    for p, other in (("shop", "search"), ("search", "shop")):
        reqs = requests_of(root / "projects" / p / "raw", 1, SEED)
        answered = {}
        for alias in ("champion", "v1"):  # both projects have a v1: each key must get its own
            answered[alias] = clients[p].chat.completions.create(model=alias, **reqs[0]).system_fingerprint
        out[f"{p}_answered_by"] = answered
        out[f"{p}_own_models_only"] = all(f == listed[p][a] for a, f in answered.items())
        # the other project's models by what it calls them: its aliases we lack, and its Triton model names
        foreign = sorted({a for a in listed[other] if a not in listed[p]} | set(listed[other].values()))
        refused = {}
        for model in foreign:
            try:
                clients[p].chat.completions.create(model=model, **reqs[0])
                refused[model] = "answered"
            except NotFoundError as exc:
                refused[model] = f"404 {exc.code}"
        out[f"{p}_asking_{other}_models"] = refused
    admin = ("admin", (root / "runs" / "mlflow-admin.password").read_text().strip())
    carol = ("carol", (root / "runs" / "users" / "carol.password").read_text().strip())
    from pipelines.clients.mlflow import server_url
    from pipelines.config import load_settings

    mlflow = f"{server_url(load_settings(root=str(root)))}/api/2.0/mlflow"
    ids = {
        e["name"]: e["experiment_id"]
        for e in httpx.post(f"{mlflow}/experiments/search", auth=admin, json={"max_results": 100}, timeout=30).json()[
            "experiments"
        ]
    }
    for p in ("shop", "search"):
        r = httpx.post(
            f"{mlflow}/runs/search", auth=carol, json={"experiment_ids": [ids[f"commerce-flywheel--{p}"]]}, timeout=30
        )
        out[f"carol_reads_{p}_runs"] = {
            "status": r.status_code,
            "runs": len(r.json().get("runs", [])) if r.status_code == 200 else None,
        }
    return out


def airflow_isolation(root: Path) -> dict[str, Any]:
    """carol's Airflow login for shop (`carol@shop`, a viewer) lists shop's DAGs only and is refused search's and
    a trigger of shop's (Airflow's own teams: airflow.multi_team)."""
    from pipelines.clients.airflow import AirflowRest, AirflowUnavailable
    from pipelines.config import load_settings

    rest = AirflowRest(load_settings(root=str(root)), username="carol@shop")
    out: dict[str, Any] = {"carol_lists": sorted(rest.dags())}
    for what, call in (
        ("carol_reads_search_dag", lambda: rest.dag("commerce_flywheel__search")),
        ("carol_triggers_shop_dag", lambda: rest.trigger("commerce_flywheel__shop")),
    ):
        try:
            out[what] = "allowed" if call() is not None else "HTTP 404"  # a DAG Airflow does not know: no answer
        except AirflowUnavailable as exc:
            out[what] = str(exc).rsplit(": ", 1)[-1]
    return out


def triton_models(root: Path) -> dict[str, Any]:
    """What the one Triton server holds: its loaded models (each a copy of a base model in memory) and what it
    serves (with triton.multi_lora, each project's adapters `<shared>@<adapter>` on one loaded base)."""
    from pipelines.config import load_settings
    from pipelines.serve.client import TritonClient

    client = TritonClient(load_settings(root=str(root)))
    try:
        served = client.loaded()
    finally:
        client.close()
    return {"loaded_models": [n for n in served if "@" not in n], "served": served}


def drift_retrains_only_its_project(root: Path, args: argparse.Namespace, step, log: Path) -> dict[str, Any]:
    from pipelines.clients.airflow import AirflowRest
    from pipelines.config import load_settings

    drift_day = (date.fromisoformat(DAY) + timedelta(days=1)).isoformat()
    step(
        "logs_shop_drift",
        "--project",
        "shop",
        "logs",
        "generate",
        "--records",
        "700",
        "--seed",
        "9",
        "--end-date",
        drift_day,
        "--drift",
        "holiday",
        "--drift-magnitude",
        "0.9",
        "--bad-share",
        "0.03",
    )
    rest = AirflowRest(load_settings(root=str(root)))
    flywheels = ("commerce_flywheel__shop", "commerce_flywheel__search")
    known = {d: {r["dag_run_id"] for r in rest.dag_runs(d)} for d in flywheels}
    failed_daily: list[str] = []

    def no_daily_runs() -> None:
        """Unpaused, each DAG's daily schedule starts its latest interval (02:00 today): a synthetic-traffic run
        that is not what is measured here; it is failed at once (recorded) so only asset-triggered runs train."""
        for d in flywheels:
            for r in rest.dag_runs(d):
                if (
                    r["run_type"] == "scheduled"
                    and r["state"] in ("queued", "running")
                    and r["dag_run_id"] not in known[d]
                ):
                    rest._request("PATCH", f"/api/v2/dags/{d}/dagRuns/{r['dag_run_id']}", {"state": "failed"})
                    known[d].add(r["dag_run_id"])
                    failed_daily.append(f"{d}/{r['dag_run_id']}")

    for d in ("drift_monitor__shop", *flywheels):
        rest.unpause(d)
    started = time.monotonic()
    check = rest.trigger("drift_monitor__shop", {"end_date": drift_day})
    while rest.dag_run("drift_monitor__shop", check)["state"] not in ("success", "failed"):
        no_daily_runs()
        if time.monotonic() - started > 900:
            return {"error": "the drift check did not end within 900 s", "daily_runs_failed": failed_daily}
        time.sleep(5)
    out: dict[str, Any] = {"check": rest.dag_run("drift_monitor__shop", check)["state"]}
    state = json.loads((root / "projects" / "shop" / "reports" / "drift" / "state.json").read_text())
    out["alerts"] = {k: state.get(k) for k in ("last_alert", "emitted_at", "pending") if k in state}
    deadline = time.monotonic() + args.retrain_timeout
    retrain = None
    while time.monotonic() < deadline:
        no_daily_runs()
        runs = [r for r in rest.dag_runs("commerce_flywheel__shop") if r.get("run_type") == "asset_triggered"]
        if runs:
            retrain = runs[0]
            if retrain["state"] in ("success", "failed"):
                break
        time.sleep(10)
    out["shop_retrain"] = (
        {k: retrain.get(k) for k in ("dag_run_id", "run_type", "state", "start_date", "end_date")} if retrain else None
    )
    out["asset_triggered_runs"] = {
        d: [r["state"] for r in rest.dag_runs(d) if r.get("run_type") == "asset_triggered"] for d in flywheels
    }
    out["daily_runs_failed"] = failed_daily
    out["seconds"] = round(time.monotonic() - started, 1)
    return out
