"""Showback: what one AI project used and what it cost, from the records the platform keeps anyway, priced
with the benchmarks' hardware table (hence here, beside it):

- training: every training run in the project's MLflow experiment (the variant runs the sweep tags with
  `flywheel.hardware`), its wall seconds on its device, priced per device-hour from the hardware table the
  benchmarks use (`pipelines.hardware`; a CPU run on the 2-core row);
- serving: the gateway's per-day usage of the project (requests, prompt and completion tokens, the seconds its
  requests took on the model server, refusals), priced on the serving device's row;
- storage: bytes under each of the project's zones.

`report` writes `usage.json` and `usage.html` (tables and a daily plot) under the project's reports zone.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime
from typing import Any

from pipelines.config import Settings

LOG = logging.getLogger("flywheel.projects")
ZONES = ("raw", "quarantine", "curated", "features", "serving", "reports", "runs")


def _refusals() -> tuple[str, ...]:
    """The gateway's refusal counters (`refused_*` of its usage fields): each shown, all summed."""
    from pipelines.admission.quota import USAGE_FIELDS

    return tuple(field for field in USAGE_FIELDS if field.startswith("refused_"))


def _row_for(hardware_tag: str | None, overrides: dict[str, dict[str, Any]]) -> Any:
    from pipelines.hardware import table

    rows = table(overrides)
    tag = (hardware_tag or "").lower()
    for key in ("b200", "h200", "h100"):
        if key in tag:
            return rows[key]
    return rows["cpu-2core"]


def training(settings: Settings, since: date) -> list[dict[str, Any]]:
    """The project's training runs started on or after `since`: seconds and cost each."""
    from pipelines.clients import mlflow as mlflow_client

    client = mlflow_client.client(settings)
    experiment = client.get_experiment_by_name(settings.mlflow.experiment)
    if experiment is None:
        return []
    start_ms = int(datetime.combine(since, datetime.min.time(), tzinfo=UTC).timestamp() * 1000)
    runs = client.search_runs([experiment.experiment_id], f"attributes.start_time >= {start_ms}", max_results=5000)
    out = []
    for run in runs:
        tag = run.data.tags.get("flywheel.hardware")
        if tag is None or run.info.end_time is None:
            continue  # a sweep's parent run (its variants are counted) or one still running
        # a tune run is opened once its training ended: the seconds it measured are its cost
        seconds = run.data.metrics.get("tune_seconds") or max(0.0, (run.info.end_time - run.info.start_time) / 1000)
        row = _row_for(tag, settings.bench.hardware)
        devices = int(tag.split("x", 1)[0]) if tag[:1].isdigit() and "x" in tag else 1
        out.append(
            {
                "run_id": run.info.run_id,
                "run": run.info.run_name,
                "started": datetime.fromtimestamp(run.info.start_time / 1000, UTC).isoformat(timespec="seconds"),
                "method": run.data.tags.get("flywheel.tune_method", "sft"),  # sft: a sweep's variant
                "tokens": int(run.data.metrics.get("tune_tokens") or 0) or None,
                "hardware": tag,
                "priced_as": row.name,
                "device_seconds": round(seconds * devices, 1),
                "usd": round(seconds * devices * row.usd_per_hour / 3600, 6),
            }
        )
    return sorted(out, key=lambda r: r["started"])


def by_method(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Training cost per method (sft: the sweeps' variants; dpo, grpo: the tune runs)."""
    out: dict[str, dict[str, Any]] = {}
    for r in runs:
        row = out.setdefault(r["method"], {"runs": 0, "device_seconds": 0.0, "usd": 0.0, "tokens": None})
        row["runs"] += 1
        row["device_seconds"] = round(row["device_seconds"] + r["device_seconds"], 1)
        row["usd"] = round(row["usd"] + r["usd"], 6)
        if r["tokens"] is not None:  # measured by the tune runs; a sweep's variants do not record it
            row["tokens"] = (row["tokens"] or 0) + r["tokens"]
    return out


def serving(settings: Settings, since: date) -> list[dict[str, Any]]:
    """The gateway's usage of the project per day since `since` (every replica's summed), priced on the serving
    device."""
    from pipelines.admission.quota import usage_by_day
    from pipelines.hardware import detect

    row = detect(settings.bench.hardware)
    out = []
    for day, used in usage_by_day(settings).items():
        if day < since.isoformat():
            continue
        seconds = used["compute_ms"] / 1000
        out.append(
            {
                "day": day,
                "requests": used["requests"],
                "prompt_tokens": used["prompt_tokens"],
                "completion_tokens": used["completion_tokens"],
                "compute_seconds": round(seconds, 2),
                **{field: used[field] for field in _refusals()},
                "queue_seconds": round(used["queue_ms"] / 1000, 2),
                "priced_as": row.name,
                "usd": round(seconds * row.usd_per_hour / 3600, 6),
            }
        )
    return sorted(out, key=lambda r: r["day"])


def storage(settings: Settings) -> dict[str, int]:
    """Bytes the project keeps, by zone (0 for one not written yet). The platform's shared places (one Triton model
    repository and its adapters for every project, one MLflow artifact store) are split by owner: a project is
    billed its own models and its own experiment's artifacts, never another's; `default` too."""
    out = {}
    shared = _shared_folders(settings)
    for zone in ZONES:
        out[zone] = _size(settings.zone(zone), skip=shared)  # type: ignore[arg-type]
    out["serving"] += sum(_size(uri) for uri in _own_models(settings))
    out["runs"] += _size(_own_artifacts(settings) or "", skip=())
    return out


def _size(uri: str, skip: tuple[str, ...] = ()) -> int:
    """Bytes under `uri`, leaving out the folders in `skip` (URIs) under it."""
    from pipelines.storage import exists, fs_for

    if not uri or not exists(uri):
        return 0
    fs, path = fs_for(uri)
    total = int(fs.du(path, total=True))
    for folder in skip:
        inner_fs, inner = fs_for(folder)
        if inner.rstrip("/").startswith(path.rstrip("/") + "/") and exists(folder):
            total -= int(inner_fs.du(inner, total=True))
    return max(total, 0)


def _shared_folders(settings: Settings) -> tuple[str, ...]:
    """The folders every project's data shares: the Triton model repository with the adapters beside it, and the
    MLflow artifact store (they lie under the platform's `serving` and `runs` zones by default)."""
    repository = str(settings.triton.model_repository).rstrip("/")
    found = [repository, f"{repository.rsplit('/', 1)[0]}/lora_adapters"]
    if settings.mlflow.artifacts_destination:
        found.append(str(settings.mlflow.artifacts_destination).rstrip("/"))
    return tuple(found)


def _own_models(settings: Settings) -> list[str]:
    """The project's model folders in the shared repository and its adapters beside it (`<project>__<model>_v<N>`
    for a project, `<model>_v<N>` for `default`)."""
    from pipelines.storage import glob

    repository = str(settings.triton.model_repository).rstrip("/")
    prefix = settings.triton.model_name  # already carries the project's name
    found = []
    for folder in (repository, f"{repository.rsplit('/', 1)[0]}/lora_adapters"):
        found += [uri for uri in glob(f"{folder}/{prefix}_v*") if uri.rstrip("/").rsplit("/", 1)[-1].startswith(prefix)]
    return found


def _own_artifacts(settings: Settings) -> str | None:
    """Where the project's MLflow experiment keeps its artifacts (None before it has one, or off the store)."""
    from pipelines.clients import mlflow as mlflow_client

    try:
        experiment = mlflow_client.client(settings).get_experiment_by_name(settings.mlflow.experiment)
    except Exception:  # noqa: BLE001 (the tracking store unreachable: nothing is billed for it, said in the logs)
        LOG.warning("showback: the MLflow experiment of %s could not be read", settings.project)
        return None
    if experiment is None:
        return None
    location = str(experiment.artifact_location)
    if location.startswith("mlflow-artifacts:"):  # served by the tracking server from artifacts_destination
        return f"{str(settings.mlflow.artifacts_destination).rstrip('/')}/{location.split(':', 1)[1].strip('/')}"
    return location.removeprefix("file://")


def summarize(settings: Settings, since: date) -> dict[str, Any]:
    from pipelines.hardware import table

    runs, days, stored = training(settings, since), serving(settings, since), storage(settings)
    prices = {
        r.name: {"usd_per_hour": r.usd_per_hour, "source": r.price_source, "date": r.price_date}
        for r in table(settings.bench.hardware).values()
    }
    return {
        "project": settings.project,
        "since": since.isoformat(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "training": {
            "runs": len(runs),
            "device_seconds": round(sum(r["device_seconds"] for r in runs), 1),
            "usd": round(sum(r["usd"] for r in runs), 6),
            "by_method": by_method(runs),
            "by_run": runs,
        },
        "serving": {
            "requests": sum(d["requests"] for d in days),
            "tokens": sum(d["prompt_tokens"] + d["completion_tokens"] for d in days),
            "compute_seconds": round(sum(d["compute_seconds"] for d in days), 2),
            "refused": sum(d[field] for d in days for field in _refusals()),
            "usd": round(sum(d["usd"] for d in days), 6),
            "by_day": days,
        },
        "storage": {"bytes": sum(stored.values()), "by_zone": stored},
        "total_usd": round(sum(r["usd"] for r in runs) + sum(d["usd"] for d in days), 6),
        "prices": prices,
    }


def report(settings: Settings, since: date) -> dict[str, Any]:
    """`summarize`, written as usage.json and usage.html under <project reports>/usage/<time>/."""
    from pipelines.reports import figure_html, new_figure, page, table_html
    from pipelines.storage import write_json, write_text

    data = summarize(settings, since)
    folder = f"{settings.zone('reports')}/usage/{datetime.now(UTC):%Y%m%dT%H%M%S}"
    sections = [
        (
            "Totals",
            table_html(
                [
                    {
                        "what": "training",
                        "amount": f"{data['training']['runs']} runs, {data['training']['device_seconds']} device-s",
                        "usd": data["training"]["usd"],
                    },
                    {
                        "what": "serving",
                        "amount": f"{data['serving']['requests']} requests, {data['serving']['tokens']} tokens",
                        "usd": data["serving"]["usd"],
                    },
                    {"what": "storage", "amount": f"{data['storage']['bytes']:,} bytes", "usd": None},
                    {"what": "total", "amount": "", "usd": data["total_usd"]},
                ]
            ),
        )
    ]
    days = data["serving"]["by_day"]
    if days:
        fig, ax = new_figure()
        ax.bar([d["day"] for d in days], [d["prompt_tokens"] + d["completion_tokens"] for d in days])
        ax.set_ylabel("tokens served")
        ax.set_title(f"{settings.project}: gateway tokens per day")
        fig.autofmt_xdate()
        sections.append(("Serving per day", figure_html(fig, "tokens per day") + table_html(days)))
    methods = [{"method": m, **row} for m, row in data["training"]["by_method"].items()]
    sections.append(("Training by method", table_html(methods)))
    sections.append(("Training runs", table_html(data["training"]["by_run"])))
    sections.append(
        ("Storage by zone", table_html([{"zone": z, "bytes": b} for z, b in data["storage"]["by_zone"].items()]))
    )
    sections.append(("Prices", table_html([{"device": k, **v} for k, v in data["prices"].items()])))
    write_json(f"{folder}/usage.json", data)
    write_text(
        f"{folder}/usage.html",
        page(f"Usage of project {settings.project}", sections, f"since {data['since']}, at {data['at']}"),
    )
    return {**data, "json_uri": f"{folder}/usage.json", "html_uri": f"{folder}/usage.html"}
