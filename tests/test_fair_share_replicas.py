"""Gateway replicas share the model's slots: each tells the others who sends through it (a file per replica beside
the model), splits the slots by what every replica sees, counts nothing from a stale or malformed file, and removes
its own when it stops (after the exchange in flight; a stuck one is never doubled)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fair_turns import _many, _settle, _waiter

from pipelines.admission.fair import FairShare


def _tell(settings, fair: FairShare, replica: str) -> list[dict]:
    """One exchange of `replica` (what peers.InStep does every gateway.turns_exchange_s): its turns out, the
    others' in."""
    import time

    from pipelines.admission import peers

    found = peers.exchange(settings, replica, {**fair.state(), "at": time.time(), "live_s": 15.0, "replica": replica})
    fair.learn(found, time.time())
    return found


def test_replicas_tell_each_other_who_sends_and_split_the_models_slots(tmp_path) -> None:
    """Two gateway replicas on one root (real files), two slots at the model: on b, shop alone sends four (none
    waits); search sends through a. Once b has read a's file, search sends on b too: shop's next waits, and the
    slots are split by demand (b: 4 + 1 against a's 1, floor(2 x 5 / 6) = 1), so b's waiter goes only when b has
    none at the model. a learns b's demand too: search's second waits behind its first. When a stops (its file
    removed), shop is alone again. b's places stay its own: search, sending elsewhere, does not halve shop's.
    (Mutations tried: the others' projects not counted as sending lets shop's fifth go at once; the slots not
    split lets it go at busy 1; a stopped replica's file kept counting leaves it waiting; the others' projects
    dividing b's places.)"""
    from pipelines.admission import peers
    from pipelines.config import load_settings

    settings = load_settings(root=str(tmp_path))

    async def main() -> None:
        a, b = FairShare(2, 30, window_s=10), FairShare(2, 30, window_s=10)
        assert await _many(b, "shop", 4) == [0.0] * 4 and not b.contended()
        assert await a.acquire("search") == 0.0
        assert _tell(settings, a, "gw-a") == []  # b has not written yet
        assert len(_tell(settings, b, "gw-b")) == 1
        assert b.contended() and b.snapshot()["peer_demand"] == 1 and b.budget() == 1
        b.enter("shop", 8)  # b's places are its own: search (elsewhere) only keeps a quarter free
        assert b.share(8) == 6
        b.leave("shop")
        got: list[str] = []
        fifth = asyncio.create_task(_waiter(b, "shop", got))
        await _settle()
        assert got == [] and b.snapshot()["waiting"] == 1
        _tell(settings, b, "gw-b")  # its next exchange: demand 5
        assert len(_tell(settings, a, "gw-a")) == 1 and a.contended() and a.snapshot()["peer_demand"] == 5
        second = asyncio.create_task(_waiter(a, "search", got))
        await _settle()
        assert got == [] and a.budget() == 1
        a.release("search")
        await _settle()
        assert got == ["search"]
        for _ in range(3):
            b.release("shop")
        await _settle()
        assert got == ["search"] and b.busy == 1, b.snapshot()  # b's share is one slot
        b.release("shop")
        await asyncio.wait_for(fifth, 5)
        assert got == ["search", "shop"]
        await second
        peers.withdraw(settings, "gw-a")  # a stops
        assert _tell(settings, b, "gw-b") == [] and not b.contended()
        assert await _many(b, "shop", 3) == [0.0] * 3 and b.busy == 4

    asyncio.run(main())


def test_a_stale_or_malformed_replica_file_counts_nothing_and_an_old_one_is_removed(tmp_path, caplog) -> None:
    """Only live files count: one older than its live span (a stopped replica) adds no project and no demand,
    one not a turns record or written an hour ahead (a clock off) is logged and left out, one older than an hour
    is removed; a live one still counts. (Mutations tried: the age not checked counts the stale file's project; a
    malformed `held` accepted; a file from the future counted.)"""
    import json
    import time

    from pipelines.admission import peers
    from pipelines.config import load_settings

    settings = load_settings(root=str(tmp_path))
    wall = time.time()
    record = {"sending": {"shop": {"seen": wall, "held": True}}, "demand": 3, "live_s": 15.0}
    files = {
        "stale": {**record, "at": wall - 20},
        "old": {**record, "at": wall - 7200},
        "ahead": {**record, "at": wall + 3600},  # a replica whose clock is an hour off
        "bad": {**record, "at": wall, "sending": {"shop": {"seen": wall, "held": "yes"}}},
        "live": {**record, "at": wall, "sending": {"search": {"seen": wall - 2, "held": False}}},
    }
    for name, data in files.items():
        path = Path(peers.turns_uri(settings, name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    Path(peers.turns_uri(settings, "junk")).write_text("{not json")
    fair = FairShare(1, 5, window_s=10)
    found = _tell(settings, fair, "me")
    assert [next(iter(f["sending"])) for f in found] == ["search"]
    assert fair._elsewhere.keys() == {"search"} and fair.peer_demand() == 3
    assert not Path(peers.turns_uri(settings, "old")).exists() and Path(peers.turns_uri(settings, "stale")).exists()
    assert "bad.json unreadable" in caplog.text and "junk.json unreadable" in caplog.text
    assert "ahead.json unreadable: written 3600 s in the future" in caplog.text
    # the rest of its window (10 s, seen 2 s before the files were written; the writes and the read take a moment)
    assert 5 < fair._elsewhere["search"] - fair.clock() <= 8.1


def test_a_replica_that_stops_removes_its_file_after_the_exchange_in_flight_and_a_stuck_one_is_never_doubled(
    tmp_path, monkeypatch, caplog
) -> None:
    """The exchange loop (peers.InStep): a failed exchange is logged and the loop goes on; at stop, the exchange
    in flight ends first and the file is removed after it (never written again after the removal); an exchange
    stuck in the store is never run twice at once, and stop returns within its bound, leaving the file to age
    out, and the stuck thread does not hold the loop's close. The setting is 0 (off) or at least 0.1 s.
    (Mutations tried: the loop's default executor (asyncio.to_thread) holds asyncio.run until the thread ends; stop
    not waiting for the exchange in flight leaves the file written after its removal;
    a new exchange every cycle while one is stuck runs it again; an exception in the exchange ending the loop.)"""
    import threading
    import time

    from pipelines.admission import peers
    from pipelines.config import ConfigError, load_settings

    with pytest.raises((ConfigError, ValueError), match="0 .off. or at least 0.1 s"):
        load_settings(root=str(tmp_path), gateway={"turns_exchange_s": 0.01})
    settings = load_settings(root=str(tmp_path), gateway={"turns_exchange_s": 0.1})
    real, calls, entered = peers.exchange, [], threading.Event()

    def slow(*args, **kwargs):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("the store said no")  # the loop logs it and goes on
        entered.set()
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(peers, "exchange", slow)

    async def stop_during_an_exchange() -> None:
        step = peers.InStep(FairShare(1, 5), settings, "gw-a")
        step.start()
        assert await asyncio.to_thread(entered.wait, 5)
        await step.stop()

    asyncio.run(stop_during_an_exchange())
    assert len(calls) == 2 and not Path(peers.turns_uri(settings, "gw-a")).exists()

    calls.clear()
    release = threading.Event()

    def stuck(*args, **kwargs):
        calls.append(time.monotonic())
        release.wait(10)
        return []

    monkeypatch.setattr(peers, "exchange", stuck)
    monkeypatch.setattr(peers, "IO_TIMEOUT_S", 0.2)
    monkeypatch.setattr(peers, "STOP_WAIT_S", 0.3)

    async def stop_while_stuck() -> float:
        step = peers.InStep(FairShare(1, 5), settings, "gw-b")
        step.start()
        await asyncio.sleep(1.0)  # about three cycles (0.2 s waited for the exchange, 0.1 s between)
        started = time.monotonic()
        await step.stop()
        return time.monotonic() - started

    started = time.monotonic()
    took = asyncio.run(stop_while_stuck())  # the stuck thread never holds the loop's close (a daemon)
    closed = time.monotonic() - started
    release.set()
    assert len(calls) == 1 and took < 2.0 and closed < 4.0, (took, closed)
    assert "exchange failed" in caplog.text  # the first loop's failed exchange, logged

    calls.clear()
    # stand-in for the exchange through the shared files, here no other replica (the real exchange:
    # tests/test_fair_share_replicas.py::test_replicas_tell_each_other_who_sends_and_split_the_models_slots)
    monkeypatch.setattr(peers, "exchange", lambda *args: calls.append(1) or [])

    class Refusing(FairShare):
        def learn(self, others, wall):  # what the others told cannot be applied: logged, the loop goes on
            raise RuntimeError("cannot apply")

    async def apply_fails() -> None:
        step = peers.InStep(Refusing(1, 5), settings, "gw-c")
        step.start()
        await asyncio.sleep(0.5)
        await step.stop()

    asyncio.run(apply_fails())
    assert len(calls) >= 2 and "the others' state not applied" in caplog.text
