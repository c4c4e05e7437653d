"""Canary: serve the registry's candidate next to the live model and compare them on replayed test traffic
(`flywheel deploy --alias candidate --canary SHARE`), under the serving state's lock."""

from __future__ import annotations

import random
from typing import Any

from pipelines.config import Settings
from pipelines.serve import repository, shared_base
from pipelines.serve.client import TritonClient
from pipelines.serve.deploy import (
    DeployFailed,
    Deployment,
    _in_use,
    _one_line,
    _save,
    _serving,
    score_replies,
    smoke_rows,
    state,
    state_lock,
)
from pipelines.serve.prompts import conversation, offered_tools


def canary(
    settings: Settings, alias: str = "candidate", *, share: float | None = None, requests: int = 24, seed: int = 0
) -> dict[str, Any]:
    """Serve the candidate next to the live model; send `share` of replayed test traffic to it and compare.
    Runs under the state's lock, so no deploy unloads either model meanwhile."""
    from pipelines.registry.models import alias_version

    version = alias_version(settings, alias)
    if version is None:
        raise DeployFailed(f"no model version has the alias '{alias}'")
    share = settings.triton.canary_share if share is None else share
    client = TritonClient(settings)
    try:
        with state_lock(settings):
            current = state(settings)
            if not current.get("live"):
                raise DeployFailed("no live model: deploy a champion first")
            live = Deployment(**current["live"])
            name = repository.triton_name(settings, version)
            model = shared_base.build_serving(
                settings, version, in_use=_in_use(current, client, name), is_loaded=client.ready
            )
            candidate = Deployment(model.name, version, model.prompt_style)
            rows = smoke_rows(settings, requests, seed)
            rng = random.Random(seed)
            routed: dict[str, list[dict[str, Any]]] = {live.name: [], candidate.name: []}
            for row in rows:
                routed[candidate.name if rng.random() < share else live.name].append(row)
            for entry in (live, candidate):
                if not client.ready(entry.name):
                    try:
                        client.load(entry.name)
                    except Exception as exc:  # noqa: BLE001 (tritonclient's errors)
                        raise DeployFailed(
                            f"canary: {entry.name} could not be loaded ({_one_line(exc)}); "
                            f"{_serving(current)} keeps serving"
                        ) from None
            result = {}
            for entry in (live, candidate):
                chosen = routed[entry.name]
                replies = client.infer(
                    entry.name,
                    [conversation(r, entry.prompt_style) for r in chosen],
                    tools=offered_tools(settings, chosen, client, entry.name),
                )
                result[entry.name] = {"version": entry.version, **score_replies(chosen, replies)}
            _save(
                settings,
                current,
                {"event": "canary", "name": candidate.name, "version": version, "share": share, "result": result},
            )
    finally:
        client.close()
    return {"live": live.name, "candidate": candidate.name, "share": share, "models": result}
