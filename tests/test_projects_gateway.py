"""One gateway, many projects: a project's key reaches its models only, its captured turns and feedback land
in its raw zone only, a revoked key is refused, and each project's quotas answer 429 with Retry-After without
touching another project. In process (FastAPI's TestClient); Triton is a stand-in that lists every project's
models and answers with a tool call (the real Triton path: test_gateway.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from project_gateway import FakeTriton, _as, _body, _captured, _until, gateway  # noqa: F401 (gateway: the fixture)


def test_a_project_key_reaches_its_own_models_and_data_only(gateway) -> None:
    """Mutations tried: a tenant keyed by anything but the caller's project (every key on the default tenant)
    fails the models and capture checks; a key index that keeps revoked keys fails the 401 check."""
    from pipelines.projects import settings_for

    client, settings, keys, stop = gateway
    listed = {
        name: {m["id"]: m["root"] for m in client.get("/v1/models", headers=_as(key)).json()["data"]}
        for name, key in keys.items()
    }
    assert listed["search"] == {"v1": "search__tool_router_v1", "champion": "search__tool_router_v1"}
    assert listed["disputes"] == {"v2": "disputes__tool_router_v2", "champion": "disputes__tool_router_v2"}
    assert listed["default"] == {"v3": "tool_router_v3", "champion": "tool_router_v3"}

    answer = client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"]))
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "track_shipment"
    assert FakeTriton.answered == ["search__tool_router_v1"]
    refused = client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["search"]))  # disputes' model
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"])).status_code == 200
    assert FakeTriton.answered == ["search__tool_router_v1", "disputes__tool_router_v2"]

    rated = client.post("/v1/feedback", json={"id": answer.json()["id"], "rating": "up"}, headers=_as(keys["search"]))
    assert rated.status_code == 200
    stop()  # the lifespan's end closes every project's capture files
    zones = {name: settings_for(settings, name).zone("raw") for name in keys}
    assert [r["record_id"] for r in _captured(zones["search"])] == [answer.json()["id"]]
    assert len(_captured(zones["disputes"])) == 1 and _captured(zones["default"]) == []
    from pipelines.logs.feedback import feedback_zone

    assert [r["record_id"] for r in _captured(feedback_zone(zones["search"]))] == [answer.json()["id"]]
    assert _captured(feedback_zone(zones["disputes"])) == [] and _captured(feedback_zone(zones["default"])) == []


def test_a_revoked_or_unknown_key_is_refused_at_once(gateway) -> None:
    from pipelines.projects import registry

    client, settings, keys, stop = gateway
    assert client.get("/v1/models", headers=_as(keys["disputes"])).status_code == 200
    registry.revoke_key(settings, "disputes", None)
    for key in (keys["disputes"], "fwp-" + "x" * 43, ""):
        gone = client.get("/v1/models", headers=_as(key))
        assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models", headers=_as(keys["search"])).status_code == 200  # the others' keys still work
    from pipelines.projects import settings_for
    from pipelines.storage import write_json

    write_json(f"{settings_for(settings, 'search').zone('serving')}/state.json", {"live": None, "previous": None})
    registry.delete(settings, "search")  # a deleted project's key stops too
    assert client.get("/v1/models", headers=_as(keys["search"])).status_code == 401


def test_quotas_answer_429_with_retry_after_and_spare_the_other_projects(gateway, monkeypatch) -> None:
    """search may send 3 requests a minute: the 4th is refused with Retry-After, while disputes (no limit) is
    answered throughout; a tokens-per-day quota refuses once the day's tokens are used, until midnight UTC;
    the day's usage is written where `project usage` reads it, and a restarted gateway counts on from it.
    (Mutations tried: a limiter shared by all projects fails the disputes check; one never refusing fails the
    429 checks.)"""
    from pipelines.admission.quota import _today, usage_by_day
    from pipelines.projects import registry, settings_for

    client, settings, keys, stop = gateway
    codes = []
    for _ in range(4):
        codes.append(client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"])).status_code)
        assert client.post("/v1/chat/completions", json=_body(), headers=_as(keys["disputes"])).status_code == 200
    assert codes == [200, 200, 200, 429]
    refused = client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"]))
    assert (
        refused.json()["error"]["code"] == "rate_limit_exceeded"
        and refused.json()["error"]["type"] == "rate_limit_error"
    )
    assert 1 <= int(refused.headers["retry-after"]) <= 60

    registry.set_quotas(settings, "disputes", tokens_per_day=250)  # each answer here costs 50 tokens
    spent = [
        client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"])).status_code
        for _ in range(2)
    ]
    assert spent == [200, 429]  # 4 answers (200 tokens) before: one more (250), then the day is spent
    over = client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"]))
    assert over.json()["error"]["code"] == "tokens_per_day_exceeded"
    assert 1 <= int(over.headers["retry-after"]) <= 86_400
    stop()
    used = usage_by_day(settings_for(settings, "disputes"))[_today()]
    assert (used["requests"], used["prompt_tokens"], used["completion_tokens"]) == (5, 200, 50)
    assert used["refused_tokens"] == 2
    searched = usage_by_day(settings_for(settings, "search"))[_today()]
    assert searched["requests"] == 3 and searched["refused_rpm"] == 2

    from fastapi.testclient import TestClient

    from pipelines.gateway.app import create_app

    with TestClient(create_app(settings), raise_server_exceptions=False) as again:  # a restart: the day counts on
        assert again.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"])).status_code == 429


def test_a_projects_concurrency_quota_leaves_the_gateways_slots_to_the_others(gateway, monkeypatch) -> None:
    """search may hold 2 requests in flight: a 3rd is refused at once while disputes is still answered; once
    search's requests end, its slots are free again (a leak would refuse it forever). (Mutation tried: no
    release after the answer fails the last check.)"""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.projects import registry

    client, settings, keys, stop = gateway
    registry.set_quotas(settings, "search", concurrent=2, rpm=100)
    release, entered = threading.Event(), threading.Semaphore(0)
    real = FakeTriton.infer_one

    def held(self, name, *args, **kwargs):
        if name.startswith("search__"):
            entered.release()
            assert release.wait(30)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(FakeTriton, "infer_one", held)
    with ThreadPoolExecutor(2) as pool:
        busy = [
            pool.submit(client.post, "/v1/chat/completions", json=_body(), headers=_as(keys["search"]))
            for _ in range(2)
        ]
        for _ in range(2):
            assert entered.acquire(timeout=30)
        third = client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"]))
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"])).status_code == 200
        release.set()
        assert [f.result(timeout=30).status_code for f in busy] == [200, 200]
    assert [
        client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"])).status_code for _ in range(3)
    ] == [200, 200, 200]


def test_usage_prices_a_projects_training_serving_and_storage_and_only_its_own(gateway) -> None:
    """`project usage`: the gateway's tokens and seconds of the project, its training runs' device time from
    MLflow priced at their device's rate, its zones' bytes; another project's traffic and runs are not in it."""
    from datetime import date

    from pipelines.clients import mlflow as mlflow_client
    from pipelines.hardware import table
    from pipelines.projects import settings_for, showback

    client, settings, keys, stop = gateway
    for project, n in (("search", 2), ("disputes", 1)):
        for _ in range(n):
            assert client.post("/v1/chat/completions", json=_body(), headers=_as(keys[project])).status_code == 200
    stop()
    search, disputes = settings_for(settings, "search"), settings_for(settings, "disputes")
    for scoped, tag, seconds in ((search, "1x NVIDIA H100 80GB HBM3", 3600), (disputes, "CPU x86_64 x2 threads", 60)):
        mlflow = mlflow_client.client(scoped)
        experiment = mlflow.get_experiment_by_name(scoped.mlflow.experiment).experiment_id
        run = mlflow.create_run(experiment, start_time=1_790_000_000_000, tags={"flywheel.hardware": tag})
        mlflow.set_terminated(run.info.run_id, end_time=1_790_000_000_000 + seconds * 1000)
        mlflow.create_run(experiment, start_time=1_790_000_000_000)  # a sweep's parent run: not counted twice
    used = showback.report(search, date(2026, 1, 1))
    assert (used["serving"]["requests"], used["serving"]["tokens"]) == (2, 100)
    assert used["training"]["runs"] == 1 and used["training"]["device_seconds"] == 3600.0
    assert used["training"]["usd"] == pytest.approx(table()["h100"].usd_per_hour)
    assert used["storage"]["by_zone"]["raw"] > 0 and used["storage"]["bytes"] >= used["storage"]["by_zone"]["raw"]
    assert Path(used["html_uri"]).is_file() and json.loads(Path(used["json_uri"]).read_text())["project"] == "search"
    other = showback.summarize(disputes, date(2026, 1, 1))
    assert other["serving"]["requests"] == 1 and other["training"]["usd"] == pytest.approx(
        60 * table()["cpu-2core"].usd_per_hour / 3600
    )


def test_a_quiet_project_goes_to_the_model_at_once_not_behind_a_busy_projects_queue(gateway, monkeypatch) -> None:
    """One slot at the model (gateway.backend_slots 1) while two projects send: disputes has just been answered,
    search holds the slot and queues two more; disputes' request, sent last, goes to the model at once (second,
    not fourth: first come, first served would answer it last). The queue's figures are the operator's only
    (the gateway's key; a project key gets a 404). Then, with 4 places in the gateway: search's third request
    is refused at once (its share, 2 of 4, while two projects send), and its waiting one, past
    gateway.queue_timeout_s, is a 429 with Retry-After, each counted in search's usage; no slot or place leaks.
    (Mutations tried: first come, first served fails the order; no share lets the third in; a timed-out
    waiter left in its queue, or a slot or place never given back, fails the last requests.)"""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from pipelines.admission.quota import usage_by_day
    from pipelines.gateway.app import create_app
    from pipelines.projects import registry, settings_for

    _client, settings, keys, stop = gateway
    stop()  # the fixture's gateway (4 slots) is closed; this one has one slot
    registry.set_quotas(settings, "search", rpm=100)
    gate, hold, order, lock = threading.Event(), threading.Event(), [], threading.Lock()
    real = FakeTriton.infer_one

    def held(self, name, *args, **kwargs):
        with lock:
            order.append(name.split("__")[0])
        assert not hold.is_set() or gate.wait(30)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(FakeTriton, "infer_one", held)
    one_slot = settings.model_copy(
        update={
            "gateway": settings.gateway.model_copy(
                update={"backend_slots": 1, "queue_timeout_s": 20.0, "fair_window_s": 60.0}
            )
        }
    )
    admin = _as(keys["default"])

    def post(pool, project: str, model: str = "champion"):
        return pool.submit(client.post, "/v1/chat/completions", json=_body(model), headers=_as(keys[project]))

    with TestClient(create_app(one_slot), raise_server_exceptions=False) as client, ThreadPoolExecutor(4) as pool:
        assert client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"])).status_code == 200
        order.clear()
        hold.set()
        sent = [post(pool, "search")]
        _until(lambda: order == ["search"], "search at the model")
        sent += [post(pool, "search") for _ in range(2)]
        _until(lambda: client.get("/v1/gateway/queue", headers=admin).json()["waiting"] == 2, "search's two queued")
        sent.append(post(pool, "disputes", "v2"))
        _until(lambda: len(order) == 2, "disputes at the model")
        assert order == ["search", "disputes"]  # behind nobody's queue
        assert client.get("/v1/gateway/queue", headers=_as(keys["search"])).status_code == 404
        gate.set()
        assert [f.result(timeout=60).status_code for f in sent] == [200] * 4
        assert order == ["search", "disputes", "search", "search"]
        assert client.get("/v1/gateway/queue", headers=admin).json() == {
            "slots": 1,
            "busy": 0,
            "waiting": 0,
            "places": 0,
            "contended": True,
            "granted": 5,
            "waited": 2,
            "timed_out": 0,
            "refused_places": 0,
            "peers": 0,
            "peer_demand": 0,
            "budget": 1,
        }
        assert "queue" not in client.get("/ready").json()  # an open path says nothing about requests
    gate.clear()
    order.clear()
    short = one_slot.model_copy(
        update={"gateway": one_slot.gateway.model_copy(update={"queue_timeout_s": 5.0, "max_concurrent_requests": 4})}
    )
    with TestClient(create_app(short), raise_server_exceptions=False) as client, ThreadPoolExecutor(2) as pool:
        hold.clear()
        assert client.post("/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"])).status_code == 200
        hold.set()
        holding = post(pool, "search")
        _until(lambda: order[-1:] == ["search"], "search at the model")
        waiting = post(pool, "search")
        _until(lambda: client.get("/v1/gateway/queue", headers=admin).json()["waiting"] == 1, "search's second queued")
        third = client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"]))
        assert third.status_code == 429 and "its share of 4" in third.json()["error"]["message"]
        late = waiting.result(timeout=30)
        assert late.status_code == 429 and late.headers["retry-after"] == "1"
        assert "queue_timeout_s" in late.json()["error"]["message"]
        gate.set()
        assert holding.result(timeout=60).status_code == 200
        assert [
            client.post("/v1/chat/completions", json=_body(), headers=_as(keys["search"])).status_code for _ in range(3)
        ] == [200, 200, 200]  # nothing leaked: the slot and places come back
        turns = client.get("/v1/gateway/queue", headers=admin).json()
        assert turns["busy"] == 0 and turns["places"] == 0 and turns["refused_places"] == 1
    used = usage_by_day(settings_for(settings, "search"))
    assert sum(d["refused_share"] for d in used.values()) == 1  # its share of the places
    assert sum(d["refused_queue"] for d in used.values()) == 1  # its wait past queue_timeout_s
    assert sum(d["queue_ms"] for d in used.values()) >= 4500


def test_a_registry_that_cannot_be_read_closes_no_tenant_and_a_deleted_project_writes_nothing(tmp_path, monkeypatch):
    """An object-store blip on the registry's first read used to close every tenant, `default` included (their
    usage lost); now the last index serves and nothing closes. A project deleted while its tenant is open: its
    writers are closed and a request still in flight gets a 503 instead of recreating the moved folders.
    (Mutations tried: closing on a failed read; a writer that accepts records after close; `tenant` building a
    tenant for a project the registry no longer holds: a new writer recreates the moved raw zone.)"""
    from pipelines.config import load_settings
    from pipelines.gateway.capture import WriterClosed
    from pipelines.gateway.openai_api import ApiError
    from pipelines.gateway.tenants import Tenants
    from pipelines.projects import registry, settings_for

    settings = load_settings(root=str(tmp_path))
    registry.create(settings, "search", "alice")
    tenants = Tenants(settings, "k" * 32)
    try:
        platform, search = tenants.tenant("default"), tenants.tenant("search")
        real = registry.load
        monkeypatch.setattr(registry, "load", lambda *_a, **_k: (_ for _ in ()).throw(OSError("blip")))
        tenants._registry()
        assert tenants.all() == [platform, search] and platform.capture is not None
        platform.capture.write({"record_id": "r1", "timestamp": "2026-11-20T10:00:00+00:00"})  # still open
        monkeypatch.setattr(registry, "load", real)

        registry.delete(settings, "search")
        tenants._registry()  # the next request's look at the registry: search is gone
        assert tenants.all() == [platform]
        raw = Path(settings_for(settings, "search").zone("raw"))
        assert search.capture is not None
        with pytest.raises(WriterClosed):
            search.capture.write({"record_id": "late", "timestamp": "2026-11-20T10:00:00+00:00"})
        # a request authenticated before the delete, looked up after it: a 503, and no new tenant
        with pytest.raises(ApiError) as refused:
            tenants.lookup("search")
        assert refused.value.status == 503 and refused.value.code == "project_closed"
        assert tenants.all() == [platform] and not raw.exists()
    finally:
        tenants.close()
