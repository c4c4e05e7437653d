"""Deploy, canary and rollback on a running Triton server.

Traffic goes to the model named `live` in `<serving zone>/state.json`; the client side resolves
it (`live_model`). A deployment loads the new version next to the live one, smoke-tests it with
real test-split requests, and only then moves `live` (the old one becomes `previous` and stays
loaded, so `rollback` is a pointer swap: seconds). If loading or the smoke test fails, the new
model is unloaded, `live` does not move and the reason is raised and recorded.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from pipelines.config import Settings
from pipelines.errors import NotRetryable
from pipelines.serve import repository, server
from pipelines.serve.client import Reply, TritonClient, conversation
from pipelines.storage import read_json, write_json


class DeployFailed(NotRetryable):
    """The new model did not load or failed its smoke test; the previous model keeps serving."""


@dataclass
class Deployment:
    name: str
    version: str | None
    prompt_style: str
    deployed_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _state_uri(settings: Settings) -> str:
    return f"{settings.zone('serving')}/state.json"


def state(settings: Settings) -> dict[str, Any]:
    try:
        return read_json(_state_uri(settings))
    except FileNotFoundError:
        return {"live": None, "previous": None, "history": []}


def _save(settings: Settings, current: dict[str, Any], event: dict[str, Any]) -> None:
    current["history"] = [*current.get("history", []), {**event, "at": datetime.now(timezone.utc).isoformat(
        timespec="seconds")}][-50:]
    write_json(_state_uri(settings), current)


def live_model(settings: Settings) -> Deployment | None:
    live = state(settings).get("live")
    return Deployment(**live) if live else None


def smoke_rows(settings: Settings, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Real requests from the test split (with their training-time context), as plain dicts."""
    from pipelines.train.dataset import load_split

    return load_split(settings, "test", n, seed).to_dict("records")


def score_replies(rows: list[dict[str, Any]], replies: list[Reply]) -> dict[str, Any]:
    """Quality and latency of served answers against the rows' logged tool calls."""
    from pipelines.evaluate import metrics
    from pipelines.prep.prompt import call_text

    answered = [(r, rep) for r, rep in zip(rows, replies) if rep.error is None]
    scores = [metrics.score(rep.text or "", json.loads(call_text(r["target_json"]))) for r, rep in answered]
    latencies = sorted(rep.latency_ms for rep in replies if rep.error is None)
    summary = metrics.summarize(scores) if scores else {}
    return {"requests": len(rows), "errors": len(rows) - len(answered),
            "valid_json": summary.get("json_valid", 0.0), "exact_match": summary.get("exact_match", 0.0),
            "name_accuracy": summary.get("name_accuracy", 0.0),
            "latency_ms_p50": round(statistics.median(latencies), 1) if latencies else None,
            "prompt_tokens_mean": round(statistics.fmean(rep.prompt_tokens for _, rep in answered), 1) if answered else None}


def smoke_test(settings: Settings, client: TritonClient, entry: Deployment) -> dict[str, Any]:
    rows = smoke_rows(settings, settings.triton.smoke_requests)
    replies = client.infer(entry.name, [conversation(r, entry.prompt_style) for r in rows])
    return score_replies(rows, replies)


def deploy(settings: Settings, alias: str = "champion", *, version: str | None = None) -> dict[str, Any]:
    """Put a registered version (by alias or number) behind Triton, if it loads and passes the smoke test."""
    from pipelines.registry.models import alias_version

    version = version or alias_version(settings, alias)
    if version is None:
        raise DeployFailed(f"no model version has the alias '{alias}' in {settings.mlflow.registered_model}")
    server.up(settings)
    current = state(settings)
    started = time.perf_counter()
    model = repository.build_version(settings, version)
    entry = Deployment(model.name, version, model.prompt_style)
    if current.get("live") and current["live"]["name"] == entry.name:
        return {"deployed": entry.name, "version": version, "unchanged": True, "state": current}
    client = TritonClient(settings)
    try:
        try:
            client.load(entry.name)
        except Exception as exc:  # noqa: BLE001 (the server's reason goes into the error)
            _save(settings, current, {"event": "deploy_failed", "name": entry.name, "version": version,
                                      "reason": f"load: {exc}"})
            raise DeployFailed(f"{entry.name} did not load ({exc}); {_serving(current)} keeps serving") from None
        smoke = smoke_test(settings, client, entry)
        if smoke["errors"] or smoke["valid_json"] < settings.triton.smoke_min_valid_json:
            _unload_quietly(client, entry.name)
            _save(settings, current, {"event": "deploy_failed", "name": entry.name, "version": version,
                                      "reason": f"smoke test: {smoke}"})
            raise DeployFailed(f"{entry.name} failed its smoke test ({smoke['errors']} errors, valid JSON "
                               f"{smoke['valid_json']:.0%}); {_serving(current)} keeps serving")
        previous = current.get("live")
        current.update(live=asdict(entry), previous=previous)
        _save(settings, current, {"event": "deployed", "name": entry.name, "version": version, "smoke": smoke})
        keep = {entry.name, previous["name"] if previous else None}
        for name in client.loaded():
            if name not in keep and name != repository.triton_name(settings, None):
                _unload_quietly(client, name)
    finally:
        client.close()
    return {"deployed": entry.name, "version": version, "previous": previous, "smoke": smoke,
            "seconds": round(time.perf_counter() - started, 1)}


def rollback(settings: Settings) -> dict[str, Any]:
    """Serve the previous deployment again (a pointer swap; it is reloaded first if it was unloaded)."""
    current = state(settings)
    previous, live = current.get("previous"), current.get("live")
    if not previous:
        raise DeployFailed("nothing to roll back to: no previous deployment")
    started = time.perf_counter()
    client = TritonClient(settings)
    try:
        if not client.ready(previous["name"]):
            client.load(previous["name"])
    finally:
        client.close()
    current.update(live=previous, previous=live)
    _save(settings, current, {"event": "rollback", "name": previous["name"], "version": previous["version"]})
    return {"live": previous, "previous": live, "seconds": round(time.perf_counter() - started, 2)}


def canary(settings: Settings, alias: str = "candidate", *, share: float | None = None,
           requests: int = 24, seed: int = 0) -> dict[str, Any]:
    """Serve the candidate next to the live model; send `share` of replayed test traffic to it and compare."""
    from pipelines.registry.models import alias_version

    live = live_model(settings)
    if live is None:
        raise DeployFailed("no live model: deploy a champion first")
    version = alias_version(settings, alias)
    if version is None:
        raise DeployFailed(f"no model version has the alias '{alias}'")
    share = settings.triton.canary_share if share is None else share
    model = repository.build_version(settings, version)
    candidate = Deployment(model.name, version, model.prompt_style)
    rows = smoke_rows(settings, requests, seed)
    rng = random.Random(seed)
    routed = {live.name: [], candidate.name: []}
    for row in rows:
        routed[candidate.name if rng.random() < share else live.name].append(row)
    client = TritonClient(settings)
    try:
        if not client.ready(candidate.name):
            client.load(candidate.name)
        result = {}
        for entry in (live, candidate):
            chosen = routed[entry.name]
            replies = client.infer(entry.name, [conversation(r, entry.prompt_style) for r in chosen])
            result[entry.name] = {"version": entry.version, **score_replies(chosen, replies)}
    finally:
        client.close()
    _save(settings, state(settings), {"event": "canary", "name": candidate.name, "version": version,
                                      "share": share, "result": result})
    return {"live": live.name, "candidate": candidate.name, "share": share, "models": result}


def _serving(current: dict[str, Any]) -> str:
    return current["live"]["name"] if current.get("live") else "nothing (no model was live)"


def _unload_quietly(client: TritonClient, name: str) -> None:
    try:
        client.unload(name)
    except Exception:  # noqa: BLE001 (already gone)
        pass
