"""The MLflow adapter registry: register the sweep's best variant, gate promotion, roll back.

Aliases: a new version becomes `candidate`; `champion` moves only through `promote` (the gate in
pipelines/registry/gate.py) or `rollback`. Every decision is a tag on the version it concerns
(`flywheel.gate`), and every champion change an entry in the registered model's
`flywheel.champion_history` tag (the newest that fit in 5,000 characters), so the UI and
`flywheel registry history` show why.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from pipelines.config import REPO_ROOT, Settings
from pipelines.errors import NotRetryable
from pipelines.registry.card import TUNE_TAG, model_card, tune_tags, tuned_method
from pipelines.registry.gate import BASELINE, Verdict, gate, last_look
from pipelines.toolcall.budget import FALLBACK, recorded
from pipelines.toolcall.budget import TAG as BUDGET_TAG

if TYPE_CHECKING:
    from pipelines.toolcall.prompt import PromptStyle

CANDIDATE, CHAMPION = "candidate", "champion"
HISTORY_TAG, GATE_TAG = "flywheel.champion_history", "flywheel.gate"
TAG_LIMIT = 5000  # characters in a tag value (some MLflow stores refuse more)
REASON_CHARS = 160  # a history entry's reason, cut to keep many entries within one tag


class RegistryError(NotRetryable):
    """A registry operation that cannot succeed as asked (no candidate, nothing to roll back to, ...)."""


@dataclass
class Decision:
    promoted: bool
    candidate_version: str
    champion_version: str | None
    reason: str  # one line
    numbers: dict[str, Any]  # every compared number: overall and per tool (pipelines.registry.gate)
    compared_with: str | None = None  # "champion", "base_few_shot", or None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def code_version() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],  # noqa: S607 (git on PATH, read-only)
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def register(
    settings: Settings,
    sweep: dict[str, Any],
    evaluation: dict[str, Any] | None = None,
    tune: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Register the sweep's best variant as an adapter-only pyfunc model version with alias `candidate`; with a
    `tune` result that trained (`tune.stage.summary`), that tuned adapter and its run in the variant's place.

    Idempotent: a version already registered from this sweep and tune method is returned as is."""
    from mlflow.data.http_dataset_source import HTTPDatasetSource
    from mlflow.data.meta_dataset import MetaDataset

    import mlflow
    from pipelines.clients.mlflow import client as mlflow_client
    from pipelines.logs.tools import TOOLS
    from pipelines.prep.dataset import manifest
    from pipelines.registry.pyfunc import ToolCallerModel
    from pipelines.toolcall.prompt import tools_json

    if sweep.get("best") is None:
        raise RegistryError(f"sweep {sweep['sweep_id']}: no variant completed; nothing to register")
    variant = sweep["variants"][sweep["best"]]
    method = tuned_method(tune)
    if method != "off":  # the tuned adapter is the candidate; its run (a child of the sweep's) carries it
        variant = {**variant, "adapter_dir": tune["adapter_dir"], "run_id": tune["run_id"]}  # type: ignore[index]
    name = settings.mlflow.registered_model
    client = mlflow_client(settings)
    try:
        client.get_registered_model(name)
    except mlflow.exceptions.MlflowException:
        client.create_registered_model(name, description="LoRA adapters for the commerce agent's tool-calling step")
    for version in client.search_model_versions(f"name='{name}'"):
        if version.tags.get("flywheel.sweep_id") == sweep["sweep_id"] and (version.tags.get(TUNE_TAG, "off") == method):
            client.set_registered_model_alias(name, CANDIDATE, version.version)
            return {"name": name, "version": str(version.version), "run_id": version.run_id, "existing": True}

    lineage = manifest(settings, sweep.get("window"))  # the window the sweep trained on, not the newest
    window = lineage.get("window") or {}
    window = f"{window['start']}_{window['end']}" if isinstance(window, dict) else str(window)
    tool_schema_version = hashlib.sha256(tools_json(TOOLS).encode()).hexdigest()[:12]
    meta = _model_meta(sweep, tool_schema_version)
    card = model_card(name, sweep, variant, evaluation, lineage.get("label_sources"), tune)
    with tempfile.TemporaryDirectory() as tmp:
        meta_file = Path(tmp) / "flywheel.json"
        meta_file.write_text(json.dumps(meta, indent=2))
        model_dir = Path(tmp) / "model"
        mlflow.pyfunc.save_model(
            str(model_dir),
            python_model=ToolCallerModel(),
            artifacts={"adapter": variant["adapter_dir"], "flywheel": str(meta_file)},
            pip_requirements=["mlflow", "torch", "transformers", "peft", "commerce-flywheel"],
            metadata={k: str(v) for k, v in meta.items()},
        )
        (model_dir / "README.md").write_text(card)
        with mlflow.start_run(run_id=variant["run_id"]) as run:
            mlflow.log_artifacts(str(model_dir), "registered_model")
            # mlflow: MetaDataset is concrete (its base Dataset marks `profile` abstract, without ABCMeta)
            dataset = MetaDataset(  # type: ignore[abstract]
                source=HTTPDatasetSource(lineage["training_set"]["uri"]),
                name=f"sft-{window or 'window'}",
                digest=sweep["dataset_digest"][:36],
            )
            mlflow.log_input(dataset, context="training")
            source = f"{run.info.artifact_uri}/registered_model"
    tags = {**_version_tags(sweep, meta, window, evaluation), **tune_tags(tune)}
    version = client.create_model_version(name, source=source, run_id=variant["run_id"], tags=tags, description=card)
    _wait_ready(client, name, version.version)
    client.set_registered_model_alias(name, CANDIDATE, version.version)
    return {"name": name, "version": str(version.version), "run_id": variant["run_id"], "existing": False}


def _model_meta(sweep: dict[str, Any], tool_schema_version: str) -> dict[str, Any]:
    """The registered model's `flywheel.json` (also its MLflow metadata): base model, prompt, lineage, budget."""
    return {
        "base_model": sweep["base_model"],
        "prompt_style": sweep["prompt_style"],
        "backend": sweep["backend"],
        "tool_schema_version": tool_schema_version,
        "dataset_digest": sweep["dataset_digest"],
        "sweep_id": sweep["sweep_id"],
        "code_version": code_version(),
        "answer_budget": sweep.get("answer_budget") or FALLBACK,  # pyfunc's default max_new_tokens
        "prompt_template": "pipelines.toolcall.prompt.system_prompt"
        if sweep["prompt_style"] == "full"
        else f"pipelines.toolcall.prompt.short_system_prompt (style {sweep['prompt_style']})",
    }


def _version_tags(
    sweep: dict[str, Any], meta: dict[str, Any], window: str, evaluation: dict[str, Any] | None
) -> dict[str, str]:
    """The model version's tags: its sweep, data, code, base model, prompt, training window, budget, evaluation."""
    tags = {
        "flywheel.sweep_id": sweep["sweep_id"],
        "flywheel.sweep_run_id": sweep["parent_run_id"],
        "flywheel.dataset_digest": sweep["dataset_digest"],
        "flywheel.code_version": meta["code_version"],
        "flywheel.base_model": sweep["base_model"],
        "flywheel.prompt_style": sweep["prompt_style"],
        "flywheel.tool_schema_version": meta["tool_schema_version"],
    }
    if window:  # the drift monitor's reference: the champion's training window
        tags["flywheel.training_window"] = window
    if sweep.get("answer_budget"):  # what Triton, evaluation and the gateway let this version write
        tags[BUDGET_TAG] = str(sweep["answer_budget"])
    if evaluation:
        tags["flywheel.evaluation"] = evaluation.get("json_uri", "")
    return tags


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


def prompt_style(settings: Settings, version: str) -> PromptStyle:
    """The prompt style a registered version was trained with (its tag)."""
    from pipelines.clients.mlflow import client as mlflow_client

    tags = mlflow_client(settings).get_model_version(settings.mlflow.registered_model, version).tags
    # `register` writes the tag from the sweep's prompt_style (a validated PromptStyle)
    return cast("PromptStyle", tags.get("flywheel.prompt_style", "short"))


def answer_budget(settings: Settings, version: str) -> int | None:
    """The answer budget recorded with a registered version (None: registered before budgets were)."""
    from pipelines.clients.mlflow import client as mlflow_client

    return recorded(mlflow_client(settings).get_model_version(settings.mlflow.registered_model, version).tags)


def adapter_path(settings: Settings, version: str) -> str:
    """The version's adapter folder, downloaded from the artifact store (cached by MLflow per call)."""
    import mlflow
    from pipelines.clients.mlflow import use_tracking

    use_tracking(settings)
    local = mlflow.artifacts.download_artifacts(f"models:/{settings.mlflow.registered_model}/{version}")
    return str(Path(local) / "artifacts" / "adapter")


def evaluation_rows(evaluated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The evaluation table's rows by condition, each with `per_tool` {tool: {n, exact_match, arg_f1, text_f1}}
    (taken from the report JSON when the table row does not carry it)."""
    from pipelines.storage import read_json

    rows = {r["condition"]: dict(r) for r in evaluated.get("table") or []}
    if all("per_tool" in r for r in rows.values()) or not evaluated.get("json_uri"):
        return rows
    try:
        report = read_json(evaluated["json_uri"])
    except (OSError, ValueError):  # no report to read: the gate says per-tool numbers were not measured
        return rows
    for condition in report.get("conditions") or []:
        row = rows.get(condition.get("condition"))
        if row is not None and "per_tool" not in row:
            row["per_tool"] = {
                tool: {
                    "n": s.get("examples"),
                    "exact_match": s.get("exact_match"),
                    "arg_f1": s.get("arg_f1"),
                    "text_f1": s.get("text_f1"),
                    "wrong_writes": s.get("wrong_writes"),
                    "write": bool(s.get("expected_writes")),
                }
                for tool, s in (condition.get("per_tool") or {}).items()
            }
            summary = condition.get("summary") or {}
            row.setdefault("examples", summary.get("examples"))
            row.setdefault("per_request", condition.get("per_request") or [])
            row.setdefault("wrong_write_pairs", summary.get("wrong_write_pairs"))
    return rows


def served_rows(settings: Settings, rows: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], str]:
    """The evaluation rows decoded the way models are served (`triton.constrained`: the `_constrained`
    rows, renamed to their condition), and which decoding that is; the other decoding's rows when the
    evaluation did not measure the served one (`evaluation.constrained` off or on only)."""
    from pipelines.evaluate.pipeline import CONSTRAINED

    constrained = {k.removesuffix(CONSTRAINED): v for k, v in rows.items() if k.endswith(CONSTRAINED)}
    free = {k: v for k, v in rows.items() if not k.endswith(CONSTRAINED)}
    want_constrained = settings.triton.constrained
    if "tuned_candidate" not in (constrained if want_constrained else free):
        want_constrained = not want_constrained
    return (constrained, "constrained decoding") if want_constrained else (free, "unconstrained decoding")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _record_decision(client: Any, name: str, decision: Decision) -> None:
    """The decision as the version's `flywheel.gate` tag; when the full record (per-tool numbers)
    exceeds a tag, it goes to `gate/decision-<time>.json` on the version's run and the tag keeps a
    summary with the overall numbers and that artifact's path."""
    full = json.dumps(decision.to_dict(), default=str)
    if len(full) <= TAG_LIMIT:
        client.set_model_version_tag(name, decision.candidate_version, GATE_TAG, full)
        return
    summary = decision.to_dict()
    summary["numbers"] = {k: v for k, v in decision.numbers.items() if not isinstance(v, dict)}
    run_id = client.get_model_version(name, decision.candidate_version).run_id
    if run_id:
        artifact = f"gate/decision-{_now().replace(':', '')}.json"
        client.log_text(run_id, json.dumps(decision.to_dict(), default=str, indent=1), artifact)
        summary["full_decision"] = f"runs:/{run_id}/{artifact}"
    summary["reason"] = summary["reason"][: TAG_LIMIT // 2]
    client.set_model_version_tag(
        name, decision.candidate_version, GATE_TAG, json.dumps(summary, default=str)[:TAG_LIMIT]
    )


def promote(
    settings: Settings,
    rows: dict[str, dict[str, Any]],
    version: str | None = None,
    reason_prefix: str = "",
    veto: str | None = None,
) -> Decision:
    """Gate `version` (the one this run registered; default: whatever `candidate` points at) on the
    evaluation `rows` by condition, record the decision on it either way, and move `champion` if it passed.

    Refuses (RegistryError) when `candidate` moved to another version since `version` was registered.
    The comparison needs the champion's row (`tuned_champion`, measured on the same requests); a row
    carrying `version` must be of the current champion. Crash-safe order: the decision tag, then the
    history entry, then the alias (rollback ignores an entry whose alias move never happened)."""
    from pipelines.clients.mlflow import client as mlflow_client

    name = settings.mlflow.registered_model
    current = alias_version(settings, CANDIDATE)
    if current is None:
        raise RegistryError(f"{name} has no `candidate` version to promote")
    candidate = str(version) if version is not None else current
    if candidate != current:
        raise RegistryError(
            f"{name}: `candidate` now points at v{current}, not v{candidate} that this run "
            f"registered and evaluated; not promoting (re-run the evaluation for v{current})"
        )
    champion = alias_version(settings, CHAMPION)
    if champion == candidate:
        return Decision(False, candidate, champion, "the candidate is already the champion", {})
    rows, decoding = served_rows(settings, rows)
    candidate_row, champion_row = rows["tuned_candidate"], rows.get("tuned_champion")
    evaluated_champion = None if champion_row is None else champion_row.get("version")
    if champion is None:
        champion_row = None  # nothing to defend: the baseline decides
    if champion is not None and (champion_row is None or evaluated_champion not in (None, champion)):
        measured = f"v{evaluated_champion}" if evaluated_champion else "no champion"
        why = (
            f"not promoted: the champion is v{champion} but the evaluation measured {measured}; "
            f"re-run the evaluation; serving unchanged"
        )
        decision = Decision(False, candidate, champion, f"{reason_prefix}{why}", {})
    else:
        verdict = last_look(
            gate(candidate_row, champion_row, settings, rows.get(BASELINE)), settings.evaluation.examples
        )
        if veto:  # another rule refused (the episode rule): recorded in the reason, whatever this gate decided
            verdict = Verdict(
                False, f"{veto}; the request-level gate: {verdict.reason}", verdict.compared_with, verdict.numbers
            )
        decision = Decision(
            verdict.promoted,
            candidate,
            champion,
            f"{reason_prefix}{verdict.reason} ({decoding})",
            {**verdict.numbers, "decoding": decoding},
            verdict.compared_with,
        )
    client = mlflow_client(settings)
    _record_decision(client, name, decision)
    if decision.promoted:
        _append_history(
            client, name, {"champion": candidate, "previous": champion, "reason": decision.reason, "at": _now()}
        )
        client.set_registered_model_alias(name, CHAMPION, candidate)
    return decision


def _history(client: Any, name: str) -> list[dict[str, Any]]:
    import mlflow

    try:
        raw = client.get_registered_model(name).tags.get(HISTORY_TAG, "[]")
    except mlflow.exceptions.MlflowException:  # nothing registered yet
        return []
    try:
        entries = json.loads(raw)
    except ValueError:  # a damaged tag: no history rather than a traceback
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def compact_history(entries: list[dict[str, Any]], limit: int = TAG_LIMIT) -> str:
    """The history as JSON within `limit` characters: reasons cut short, the oldest entries dropped."""
    entries = [{**e, "reason": str(e.get("reason", ""))[:REASON_CHARS]} for e in entries]
    text = json.dumps(entries, separators=(",", ":"))
    while len(text) > limit and len(entries) > 1:
        entries = entries[1:]
        text = json.dumps(entries, separators=(",", ":"))
    return text


def _append_history(client: Any, name: str, entry: dict[str, Any]) -> None:
    client.set_registered_model_tag(name, HISTORY_TAG, compact_history(_history(client, name) + [entry]))


def history(settings: Settings) -> list[dict[str, Any]]:
    from pipelines.clients.mlflow import client as mlflow_client

    return _history(mlflow_client(settings), settings.mlflow.registered_model)


def rollback(settings: Settings) -> dict[str, Any]:
    """Point `champion` back at the version it replaced: the newest history entry that made the
    current champion names it (entries for other versions, e.g. a promotion whose alias move never
    happened, are skipped)."""
    from pipelines.clients.mlflow import client as mlflow_client

    name = settings.mlflow.registered_model
    client = mlflow_client(settings)
    current = alias_version(settings, CHAMPION)
    made = next((e for e in reversed(_history(client, name)) if str(e.get("champion")) == str(current)), None)
    previous = (made or {}).get("previous")
    if current is None or not previous:
        raise RegistryError(f"{name}: no previous champion to roll back to (champion: {current})")
    previous = str(previous)
    _append_history(
        client, name, {"champion": previous, "previous": None, "reason": f"rollback from {current}", "at": _now()}
    )
    client.set_registered_model_alias(name, CHAMPION, previous)
    client.set_model_version_tag(name, current, "flywheel.rolled_back", _now())
    return {"name": name, "champion": previous, "was": current}
