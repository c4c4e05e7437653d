"""Shared by the projects' gateway tests: one gateway in process (FastAPI's TestClient) with projects `search`
and `disputes`, a key each, each project's champion on a stand-in Triton that lists every project's models and
answers with a tool call; and the helpers that read what it captured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.config import load_settings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "track_shipment",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    }
]


def _body(model: str = "champion", **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "where is order ord_123?"}],
        "tools": TOOLS,
        "user": "cus_0000001",
        **extra,
    }


class FakeTriton:
    """A stand-in for Triton's client (`serve.client.TritonClient`): every project's models loaded on one server,
    each answer a tool call recorded with the model that gave it. The real server behind the real gateway:
    tests/test_gateway.py::test_the_openai_client_gets_tool_calls_sync_and_streamed and
    tests/test_serve.py::test_deploy_infers_rejects_bad_requests_and_rolls_back."""

    models: list[str] = []
    answered: list[str] = []

    def loaded(self) -> list[str]:
        return list(self.models)

    def forget_inputs(self) -> None:
        pass

    def infer_one(self, name: str, turns: Any, tools: Any = None, on_text: Any = None) -> Any:
        from pipelines.serve.client import Reply

        FakeTriton.answered.append(name)
        return Reply(json.dumps({"name": "track_shipment", "arguments": {"order_id": "ord_123"}}), 40, 10, 5.0)


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(client, settings, keys, stop): projects `search` and `disputes` with a key each, and the default key; each
    project's champion deployed (serving state) on the shared stand-in Triton."""
    yield from build_gateway(tmp_path, monkeypatch)


def build_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, lifespan: bool = True):
    """The `gateway` fixture's body, for a fixture of another scope (the fuzz run's, module-wide). `lifespan`
    False: the app's lifespan is left to whoever calls it (schemathesis starts it once itself)."""
    from fastapi.testclient import TestClient

    from pipelines.gateway import router as routing
    from pipelines.gateway.app import api_key, create_app
    from pipelines.projects import registry, settings_for
    from pipelines.serve import prompts as serve_prompts
    from pipelines.storage import write_json

    settings = load_settings(root=str(tmp_path), gateway={"capture_rotate_bytes": 1024, "backend_slots": 4})
    keys = {"default": api_key(settings)}
    for name, quotas in (("search", registry.Quotas(rpm=3)), ("disputes", registry.Quotas())):
        registry.create(settings, name, "alice", quotas)
        keys[name] = registry.create_key(settings, name)[1]
    champions = {
        "default": "tool_router_v3",
        "search": "search__tool_router_v1",
        "disputes": "disputes__tool_router_v2",
    }
    for name, model in champions.items():
        scoped = settings_for(settings, name)
        write_json(
            f"{scoped.zone('serving')}/state.json",
            {"live": {"name": model, "version": model[-1], "prompt_style": "names"}, "previous": None},
        )
    FakeTriton.models, FakeTriton.answered = list(champions.values()), []
    # stand-ins for what the router reads from Triton, the MLflow registry and Feast; each real part runs in
    # tests/test_gateway.py::test_the_openai_client_gets_tool_calls_sync_and_streamed, and where named below too.
    # Triton's client:
    monkeypatch.setattr(routing.Router, "client", lambda self: FakeTriton())
    # the model folder's prompt style:
    monkeypatch.setattr(routing.Router, "_style", lambda self, name: "names")
    # the MLflow registry's `candidate` alias, here none:
    monkeypatch.setattr(routing.Router, "_candidate_version", lambda self: None)
    # Feast's online store, here no context (also
    # tests/test_quality_features.py::test_online_and_offline_context_agree):
    monkeypatch.setattr(routing.Router, "context", lambda self, customer: "")
    # constrained decoding's offered tools, here none (also
    # tests/test_serve.py::test_deploy_infers_rejects_bad_requests_and_rolls_back):
    monkeypatch.setattr(serve_prompts, "offered_tools", lambda *a, **k: [])
    client = TestClient(create_app(settings), raise_server_exceptions=False)
    if lifespan:
        client.__enter__()
    open_ = [lifespan]

    def stop() -> None:
        """The gateway's shutdown (its lifespan's end): every project's files closed, the day's usage written."""
        if open_.pop() if open_ else False:
            client.__exit__(None, None, None)

    yield client, settings, keys, stop
    stop()


def _as(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _until(check, what: str, timeout_s: float = 30) -> None:
    """Wait (polling) until `check()` holds, at most `timeout_s`; else fail with `what`."""
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _captured(zone: str) -> list[dict[str, Any]]:
    return [
        json.loads(line) for f in sorted(Path(zone).glob("dt=*/gateway-*.jsonl")) for line in f.read_text().splitlines()
    ]
