"""The MLflow adapter registry: register the sweep's best variant, gate promotion, roll back.

Aliases: a new version becomes `candidate`; `champion` moves only through `promote` (the gate) or
`rollback`. Every decision is a tag on the version it concerns and a line in the registered model's
`flywheel.champion_history` tag, so the UI and `flywheel registry history` show why.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelines.config import REPO_ROOT, Settings
from pipelines.errors import NotRetryable

CANDIDATE, CHAMPION = "candidate", "champion"
HISTORY_TAG = "flywheel.champion_history"


class RegistryError(NotRetryable):
    """A registry operation that cannot succeed as asked (no candidate, nothing to roll back to, ...)."""


@dataclass
class Decision:
    promoted: bool
    candidate_version: str
    champion_version: str | None
    reason: str
    numbers: dict[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def code_version() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _model_card(name: str, sweep: dict[str, Any], variant: dict[str, Any], evaluation: dict[str, Any] | None) -> str:
    lines = [f"# {name}", "",
             f"LoRA adapter for the commerce agent's tool-calling step, on base model `{sweep['base_model']}` "
             f"(not included: the base is loaded by name).", "",
             f"- sweep: `{sweep['sweep_id']}` ({sweep['backend']} backend), variant {variant['index']}",
             f"- prompt style: {sweep['prompt_style']}; training set digest: `{sweep['dataset_digest']}`",
             f"- hyperparameters: {json.dumps(variant['params'], sort_keys=True)}",
             f"- validation: {json.dumps({k: round(v, 4) for k, v in variant['metrics'].items()}, sort_keys=True)}"]
    if evaluation:
        lines += ["", "## Evaluation (test split)", "", "| condition | exact match | name acc. | arg F1 | prompt tokens |"
                  " latency p50 ms |", "|---|---|---|---|---|---|"]
        for row in evaluation["table"]:
            cells = [row.get(k) for k in ("exact_match", "name_accuracy", "arg_f1", "prompt_tokens_mean",
                                          "latency_ms_p50")]
            lines.append(f"| {row['condition']} | " + " | ".join("" if c is None else f"{c:.3f}" for c in cells) + " |")
    lines += ["", "Load: `mlflow.pyfunc.load_model(\"models:/" + name + "@champion\")`."]
    return "\n".join(lines)


def register(settings: Settings, sweep: dict[str, Any], evaluation: dict[str, Any] | None = None) -> dict[str, Any]:
    """Register the sweep's best variant as an adapter-only pyfunc model version with alias `candidate`.

    Idempotent: a version already registered from this sweep's best run is returned as is."""
    import mlflow
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.data.http_dataset_source import HTTPDatasetSource

    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.prep.prompt import tools_json
    from pipelines.logs.tools import TOOLS
    from pipelines.registry.pyfunc import ToolCallerModel
    from pipelines.train.dataset import manifest

    if sweep.get("best") is None:
        raise RegistryError(f"sweep {sweep['sweep_id']}: no variant completed; nothing to register")
    variant = sweep["variants"][sweep["best"]]
    name = settings.mlflow.registered_model
    client = mlflow_client(settings)
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name, description="LoRA adapters for the commerce agent's tool-calling step")
    for version in client.search_model_versions(f"name='{name}'"):
        if version.tags.get("flywheel.sweep_id") == sweep["sweep_id"]:
            client.set_registered_model_alias(name, CANDIDATE, version.version)
            return {"name": name, "version": str(version.version), "run_id": version.run_id, "existing": True}

    lineage = manifest(settings)
    window = lineage.get("window") or {}
    window = f"{window['start']}_{window['end']}" if isinstance(window, dict) else str(window)
    tool_schema_version = hashlib.sha256(tools_json(TOOLS).encode()).hexdigest()[:12]
    meta = {"base_model": sweep["base_model"], "prompt_style": sweep["prompt_style"], "backend": sweep["backend"],
            "tool_schema_version": tool_schema_version, "dataset_digest": sweep["dataset_digest"],
            "sweep_id": sweep["sweep_id"], "code_version": code_version(),
            "prompt_template": "pipelines.prep.prompt.system_prompt" if sweep["prompt_style"] == "full"
            else f"pipelines.prep.prompt.short_system_prompt (style {sweep['prompt_style']})"}
    card = _model_card(name, sweep, variant, evaluation)
    with tempfile.TemporaryDirectory() as tmp:
        meta_file = Path(tmp) / "flywheel.json"
        meta_file.write_text(json.dumps(meta, indent=2))
        model_dir = Path(tmp) / "model"
        mlflow.pyfunc.save_model(
            str(model_dir), python_model=ToolCallerModel(),
            artifacts={"adapter": variant["adapter_dir"], "flywheel": str(meta_file)},
            pip_requirements=["mlflow", "torch", "transformers", "peft", "commerce-flywheel"],
            metadata={k: str(v) for k, v in meta.items()})
        (model_dir / "README.md").write_text(card)
        with mlflow.start_run(run_id=variant["run_id"]):
            mlflow.log_artifacts(str(model_dir), "registered_model")
            dataset = MetaDataset(source=HTTPDatasetSource(lineage["training_set"]["uri"]),
                                  name=f"sft-{window or 'window'}", digest=sweep["dataset_digest"][:36])
            mlflow.log_input(dataset, context="training")
            run = mlflow.active_run()
            source = f"{run.info.artifact_uri}/registered_model"
    tags = {"flywheel.sweep_id": sweep["sweep_id"], "flywheel.sweep_run_id": sweep["parent_run_id"],
            "flywheel.dataset_digest": sweep["dataset_digest"], "flywheel.code_version": meta["code_version"],
            "flywheel.base_model": sweep["base_model"], "flywheel.prompt_style": sweep["prompt_style"],
            "flywheel.tool_schema_version": tool_schema_version}
    if window:  # the drift monitor's reference: the champion's training window
        tags["flywheel.training_window"] = window
    if evaluation:
        tags["flywheel.evaluation"] = evaluation.get("json_uri", "")
    version = client.create_model_version(name, source=source, run_id=variant["run_id"], tags=tags,
                                          description=card)
    _wait_ready(client, name, version.version)
    client.set_registered_model_alias(name, CANDIDATE, version.version)
    return {"name": name, "version": str(version.version), "run_id": variant["run_id"], "existing": False}


def _wait_ready(client: Any, name: str, version: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.get_model_version(name, version).status == "PENDING_REGISTRATION" and time.monotonic() < deadline:
        time.sleep(0.5)


def alias_version(settings: Settings, alias: str) -> str | None:
    import mlflow

    from pipelines.clients.mlflow import client as mlflow_client

    try:
        return str(mlflow_client(settings).get_model_version_by_alias(settings.mlflow.registered_model, alias).version)
    except mlflow.exceptions.MlflowException:
        return None


def prompt_style(settings: Settings, version: str) -> str:
    """The prompt style a registered version was trained with (its tag)."""
    from pipelines.clients.mlflow import client as mlflow_client

    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, version).tags
    return tags.get("flywheel.prompt_style", "short")


def adapter_path(settings: Settings, version: str) -> str:
    """The version's adapter folder, downloaded from the artifact store (cached by MLflow per call)."""
    import mlflow

    from pipelines.clients.mlflow import use_tracking

    use_tracking(settings)
    local = mlflow.artifacts.download_artifacts(f"models:/{settings.mlflow.registered_model}/{version}")
    return str(Path(local) / "artifacts" / "adapter")


def gate(candidate: dict[str, Any], champion: dict[str, Any] | None, settings: Settings) -> tuple[bool, str]:
    """Promote when there is no champion, or the candidate is better by the margins and not slower.

    `candidate`/`champion`: evaluation rows (exact_match, arg_f1, latency_ms_p50) on the same requests."""
    if champion is None:
        return True, "no champion yet"
    p = settings.promotion
    failures = []
    gain = candidate["exact_match"] - champion["exact_match"]
    if gain < p.min_exact_match_gain:
        failures.append(f"exact match gain {gain:+.3f} < {p.min_exact_match_gain:+.3f}")
    f1_gain = (candidate.get("arg_f1") or 0) - (champion.get("arg_f1") or 0)
    if f1_gain < p.min_arg_f1_gain:
        failures.append(f"arg F1 gain {f1_gain:+.3f} < {p.min_arg_f1_gain:+.3f}")
    slower = candidate["latency_ms_p50"] / max(champion["latency_ms_p50"], 1e-9) - 1
    if slower > p.max_latency_increase:
        failures.append(f"latency {slower:+.0%} > {p.max_latency_increase:+.0%}")
    if failures:
        return False, "; ".join(failures)
    return True, f"exact match {gain:+.3f}, arg F1 {f1_gain:+.3f}, latency {slower:+.0%}"


def promote(settings: Settings, candidate_row: dict[str, Any], champion_row: dict[str, Any] | None,
            reason_prefix: str = "") -> Decision:
    """Apply the gate to the current `candidate` and record the decision either way."""
    from pipelines.clients.mlflow import client as mlflow_client

    name = settings.mlflow.registered_model
    candidate = alias_version(settings, CANDIDATE)
    if candidate is None:
        raise RegistryError(f"{name} has no `candidate` version to promote")
    champion = alias_version(settings, CHAMPION)
    if champion == candidate:
        return Decision(False, candidate, champion, "the candidate is already the champion", {})
    promoted, why = gate(candidate_row, champion_row, settings)
    numbers = {f"candidate_{k}": candidate_row.get(k) for k in ("exact_match", "arg_f1", "latency_ms_p50")}
    if champion_row:
        numbers.update({f"champion_{k}": champion_row.get(k) for k in ("exact_match", "arg_f1", "latency_ms_p50")})
    reason = f"{reason_prefix}{why}"
    decision = Decision(promoted, candidate, champion, reason, numbers)
    client = mlflow_client(settings)
    client.set_model_version_tag(name, candidate, "flywheel.gate", json.dumps(decision.to_dict(), default=str))
    if promoted:
        client.set_registered_model_alias(name, CHAMPION, candidate)
        _append_history(client, name, {"champion": candidate, "previous": champion, "reason": reason,
                                       "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return decision


def _history(client: Any, name: str) -> list[dict[str, Any]]:
    import mlflow

    try:
        return json.loads(client.get_registered_model(name).tags.get(HISTORY_TAG, "[]"))
    except mlflow.exceptions.MlflowException:  # nothing registered yet
        return []


def _append_history(client: Any, name: str, entry: dict[str, Any]) -> None:
    history = _history(client, name)[-49:] + [entry]  # a tag holds at most 5,000 characters in some stores
    client.set_registered_model_tag(name, HISTORY_TAG, json.dumps(history))


def history(settings: Settings) -> list[dict[str, Any]]:
    from pipelines.clients.mlflow import client as mlflow_client

    return _history(mlflow_client(settings), settings.mlflow.registered_model)


def rollback(settings: Settings) -> dict[str, Any]:
    """Point `champion` back at the version it replaced."""
    from pipelines.clients.mlflow import client as mlflow_client

    name = settings.mlflow.registered_model
    client = mlflow_client(settings)
    current = alias_version(settings, CHAMPION)
    entries = _history(client, name)
    if current is None or not entries or entries[-1]["champion"] != current or not entries[-1]["previous"]:
        raise RegistryError(f"{name}: no previous champion to roll back to (champion: {current})")
    previous = entries[-1]["previous"]
    client.set_registered_model_alias(name, CHAMPION, previous)
    client.set_model_version_tag(name, current, "flywheel.rolled_back", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    _append_history(client, name, {"champion": previous, "previous": None, "reason": f"rollback from {current}",
                                   "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return {"name": name, "champion": previous, "was": current}
