"""Many gateway replicas of one platform: each counts usage in its own file, they share a day's tokens, hold a
project's minute and its flight together, and one that sees only the flood holds it while the quiet project
sends through another. One gateway: test_projects_gateway.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from project_gateway import FakeTriton, _as, _body, _until, gateway  # noqa: F401 (gateway: the fixture)

from pipelines.config import load_settings


def test_gateway_replicas_count_usage_in_their_own_files_and_share_the_days_tokens(tmp_path: Path, monkeypatch) -> None:
    """Two gateway replicas of one project: each writes its own usage file (neither overwrites the other's
    counts), `project usage` sums them, a replica refuses once the day's tokens of both reach the limit, and a
    restarted replica counts on from its own file; the old one-file layout still counts; at midnight each day's
    counts land in their day, and a write that fails then is retried, not dropped. (Mutations tried: one shared
    file per day loses the first replica's counts, the sum fails; the others' counts left out of the tokens
    check, the 429 check fails; the failed midnight write not kept, the last check fails.)"""
    from datetime import date, timedelta

    from pipelines.admission import quota as quotas
    from pipelines.admission.quota import Quota, _today, usage_by_day
    from pipelines.gateway import openai_api as api
    from pipelines.projects.showback import serving
    from pipelines.storage import write_json

    def replica(name: str):
        return load_settings(root=str(tmp_path), project="search", gateway={"replica": name})

    def answer(quota: Quota, prompt: int, completion: int, limit: int | None = None) -> None:
        quota.admit(None, limit)
        quota.charge({"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}, 5.0)
        quota.release()

    a, b = Quota(replica("gw-a")), Quota(replica("gw-b"))
    answer(a, 40, 20)
    answer(b, 30, 0)
    a.flush()
    b.flush()  # b writes its own counts and reads a's
    total = usage_by_day(replica("gw-a"))[_today()]
    assert (total["requests"], total["prompt_tokens"], total["completion_tokens"]) == (2, 70, 20)
    assert [r["requests"] for r in serving(replica("gw-b"), date.fromisoformat(_today()))] == [2]
    with pytest.raises(api.ApiError) as refused:
        b.admit(None, 90)  # b's own 30 tokens are under 90; with a's 60 the day's are spent
    assert refused.value.status == 429
    answer(b, 1, 0, limit=91)
    assert b.used["prompt_tokens"] == 31
    again = Quota(replica("gw-a"))  # a restarted replica
    assert again.used["prompt_tokens"] == 40 and again.others["prompt_tokens"] == 30
    # a day file of the one-file layout (before replicas) still counts
    write_json(f"{replica('gw-a').zone('serving')}/gateway/usage/{_today()}.json", {"requests": 5, "prompt_tokens": 9})
    assert usage_by_day(replica("gw-a"))[_today()]["requests"] == 7
    # midnight (UTC): the day's counts are written to the day they belong to, the next day starts from zero
    today = _today()
    tomorrow = (date.fromisoformat(today) + timedelta(days=1)).isoformat()
    monkeypatch.setattr(quotas, "_today", lambda: tomorrow)
    answer(b, 2, 0)
    b.flush()
    days = usage_by_day(replica("gw-a"))
    assert days[tomorrow]["prompt_tokens"] == 2 and b.others == {}
    assert days[today]["prompt_tokens"] == 40 + 31 + 9  # a's, b's (written at the roll) and the old file's
    # a write that fails at midnight loses nothing: that day's counts are written by a later flush
    from pipelines import storage

    def down(*args, **kwargs):
        raise RuntimeError("storage down")  # not an OSError: an object store's client raises its own errors

    answer(b, 3, 0)
    later = (date.fromisoformat(tomorrow) + timedelta(days=1)).isoformat()
    monkeypatch.setattr(storage, "write_json", down)
    monkeypatch.setattr(quotas, "_today", lambda: later)
    answer(b, 1, 0)  # rolls: the day before's last record waits for the next flush
    b.flush()  # whose writes fail: both records kept
    monkeypatch.setattr(storage, "write_json", write_json)
    b.flush()
    days = usage_by_day(replica("gw-a"))
    assert (days[tomorrow]["prompt_tokens"], days[later]["prompt_tokens"]) == (5, 1)


def test_gateway_replicas_hold_a_projects_minute_and_flight_together(tmp_path: Path, monkeypatch) -> None:
    """Requests per minute and in flight hold across replicas however the balancer spreads them: each replica's
    file carries its minute (per second) and its flight, and a replica admits only while its own and the others'
    (as last read) are under the limit; one replica with every request gets the whole limit. Retry-After says
    when the oldest request leaves the minute; a restarted replica counts on from its own minute; a replica with
    a request in flight rewrites its file every flush and one that ended it says so; a file older than its live
    span counts no flight, requests over a minute old count for nobody, a malformed file counts nothing; within
    a minute after midnight the day before's files still count; a flush's write never holds up an admission.
    (Mutations tried, each failed this test: the
    others' minute left out; the others' flight left out; a stale file's flight counted; a restarted replica's
    minute not read back; a file written only on news; release not marking the file; the day before not read; a
    malformed file's flight counted; the seconds written 40 s early; the write made under the lock.)"""
    import time
    from datetime import datetime, timedelta

    from pipelines.admission import quota as quotas
    from pipelines.admission.quota import Quota, usage_uri
    from pipelines.gateway import openai_api as api
    from pipelines.storage import read_json, write_json

    def quota(name: str, project: str = "search") -> Quota:
        return Quota(load_settings(root=str(tmp_path), project=project, gateway={"replica": name}))

    a, b = quota("gw-a"), quota("gw-b")
    for _ in range(3):
        a.admit(4, None)
        a.release()
    a.flush()
    b.flush()  # b reads a's minute: 3 of the 4
    b.admit(4, None)
    b.release()
    with pytest.raises(api.ApiError) as refused:
        b.admit(4, None)
    assert refused.value.status == 429 and 58 <= int(refused.value.headers["Retry-After"]) <= 60
    b.flush()
    a.flush()
    with pytest.raises(api.ApiError):
        a.admit(4, None)  # and a reads b's
    alone = quota("gw-c")  # one replica taking every request has the whole limit (the others' 4 of 8)
    for _ in range(4):
        alone.admit(8, None)
        alone.release()
    with pytest.raises(api.ApiError):
        alone.admit(8, None)
    again = quota("gw-a")  # restarted: its own minute is read back from its file, at its time
    assert len(again._minute) == 3 and abs(time.monotonic() - again._minute[0]) < 2
    other = usage_uri(a.settings, a.day, "gw-x")  # a replica whose 4 requests are 30 s old
    write_json(other, {"replica": "gw-x", "at": time.time(), "inflight": 0, "minute": [[time.time() - 30, 4]]})
    quota("gw-y", "disputes").admit(4, None)  # another project's minute is its own
    with pytest.raises(api.ApiError) as refused:
        quota("gw-z").admit(8, None)  # a's 3, b's 1 and x's 4 in the minute
    assert 28 <= int(refused.value.headers["Retry-After"]) <= 32  # when x's leave the minute

    c, d = quota("gw-c", "shop"), quota("gw-d", "shop")
    c.admit(None, None, concurrent=1)  # in flight on c
    c.flush()
    d.flush()
    with pytest.raises(api.ApiError) as refused:
        d.admit(None, None, concurrent=1)
    assert refused.value.headers["Retry-After"] == str(quotas.FLUSH_EVERY_S.__ceil__())  # the others' next news
    uri = usage_uri(c.settings, c.day, "gw-c")
    record = read_json(uri)
    assert record["inflight"] == 1 and record["minute"][0][1] == 1
    write_json(uri, {**record, "at": time.time() - 100})
    c.flush()  # nothing new on c, but a request still in flight (a long answer): written again, still live
    assert time.time() - read_json(uri)["at"] < quotas.LIVE_S
    c.release()
    c.flush()
    d.flush()
    assert d.others_inflight == 0  # c's request ended, and c said so
    write_json(
        uri,
        {
            **read_json(uri),
            "inflight": 3,
            "at": time.time() - quotas.LIVE_S - 1,  # c stopped
            "minute": [[time.time() - 61, 1]],
        },
    )
    write_json(usage_uri(c.settings, c.day, "gw-bad"), {"replica": "gw-bad", "at": time.time(), "inflight": -5})
    d.flush()
    assert d.others_inflight == 0 and d.others_minute == []
    d.admit(1, None, concurrent=1)
    d.release()
    own = usage_uri(c.settings, c.day, "gw-e")  # its own file's minute is malformed: its day's counts stay
    write_json(own, {"replica": "gw-e", "prompt_tokens": 7, "minute": "x"})
    assert quota("gw-e", "shop").used["prompt_tokens"] == 7

    # a flush writes outside the quota's lock: a request is admitted while the store takes its time
    import threading

    from pipelines import storage

    entered, admitted, seen = threading.Event(), threading.Event(), []

    def slow(*args, **kwargs):
        entered.set()
        seen.append(admitted.wait(10))  # False: the admission waited for this write (the lock held)
        return write_json(*args, **kwargs)

    monkeypatch.setattr(storage, "write_json", slow)
    writer = threading.Thread(target=d.flush)
    writer.start()
    assert entered.wait(10)
    d.admit(None, None)
    admitted.set()
    writer.join(30)
    monkeypatch.setattr(storage, "write_json", write_json)
    assert seen and all(seen)  # every write (two if the UTC day turned meanwhile) saw the admission first
    d.release()

    # just after midnight (UTC): f has rolled to the new day, g's minute is in the day before's file
    g = quota("gw-g", "invoices")
    for _ in range(2):
        g.admit(None, None)
        g.release()
    g.flush()
    tomorrow = (datetime.fromisoformat(g.day) + timedelta(days=1)).date().isoformat()
    monkeypatch.setattr(quotas, "_today", lambda: tomorrow)  # the clock says just before (midnight is ahead)
    f = quota("gw-f", "invoices")
    assert f.day == tomorrow
    f.admit(3, None)
    with pytest.raises(api.ApiError):
        f.admit(3, None)


def test_a_replica_that_sees_only_the_flood_holds_it_while_the_quiet_project_sends_through_another(
    gateway, monkeypatch
) -> None:
    """Two gateway replicas (two apps, `gateway.replica` gw-a and gw-b) on one root, one slot at the model, their
    turns exchanged every 2 s (gateway/peers.py). disputes' request is at the model through gw-a; search sends
    three through gw-b, which has never seen disputes: its first goes (one per project), the other two wait in
    gw-b's queue, as they would on one gateway, and go when search's answers end (disputes' still at the model).
    When gw-a stops, its turns file is gone. (Mutation tried: the replicas' turns not exchanged: gw-b sends all
    three at once. The file written after its removal: test_fair_share_replicas.py.)"""
    import contextlib
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from pipelines.admission import peers
    from pipelines.gateway.app import create_app
    from pipelines.projects import registry

    _client, settings, keys, stop = gateway
    stop()
    registry.set_quotas(settings, "search", rpm=100)
    gates = {"disputes": threading.Event(), "search": threading.Event()}
    order, lock = [], threading.Lock()
    real = FakeTriton.infer_one

    def held(self, name, *args, **kwargs):
        project = name.split("__")[0]
        with lock:
            order.append(project)
        assert gates[project].wait(30)
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(FakeTriton, "infer_one", held)

    def replica(name: str):
        return settings.model_copy(
            update={
                "gateway": settings.gateway.model_copy(
                    update={
                        "backend_slots": 1,
                        "queue_timeout_s": 30.0,
                        "fair_window_s": 1.0,
                        "replica": name,
                        "turns_exchange_s": 2.0,
                    }
                )
            }
        )  # its news lives 6 s: a late exchange on a loaded machine keeps it

    admin = _as(keys["default"])

    a = TestClient(create_app(replica("gw-a")), raise_server_exceptions=False)
    a.__enter__()
    a_open = [True]

    def stop_a() -> None:
        if a_open.pop() if a_open else False:
            a.__exit__(None, None, None)

    with contextlib.ExitStack() as closing:
        closing.callback(stop_a)
        b = closing.enter_context(TestClient(create_app(replica("gw-b")), raise_server_exceptions=False))
        pool = closing.enter_context(ThreadPoolExecutor(4))
        closing.callback(lambda: [gate.set() for gate in gates.values()])  # a failed check leaves no thread held
        quiet = pool.submit(a.post, "/v1/chat/completions", json=_body("v2"), headers=_as(keys["disputes"]))
        _until(lambda: order == ["disputes"], "disputes at the model")
        _until(
            lambda: b.get("/v1/gateway/queue", headers=admin).json()["peer_demand"] == 1,
            "gw-b told that disputes has one at the model",
        )
        flood = [
            pool.submit(b.post, "/v1/chat/completions", json=_body(), headers=_as(keys["search"])) for _ in range(3)
        ]
        _until(lambda: b.get("/v1/gateway/queue", headers=admin).json()["waiting"] == 2, "search's two queued on gw-b")
        assert order == ["disputes", "search"]
        turns = b.get("/v1/gateway/queue", headers=admin).json()
        assert turns["peers"] == 1 and turns["busy"] == 1 and turns["budget"] == 1
        gates["search"].set()  # search's answers end one after another: each frees the one slot for the next
        assert [f.result(timeout=30).status_code for f in flood] == [200] * 3
        assert order == ["disputes", "search", "search", "search"] and not quiet.done()
        gates["disputes"].set()
        assert quiet.result(timeout=30).status_code == 200
        assert Path(peers.turns_uri(settings, "gw-a")).exists()
        stop_a()  # gw-a stops: its file goes with it
        assert not Path(peers.turns_uri(settings, "gw-a")).exists()
