"""The gateway's turns at the shared model (pipelines/admission/fair.py), on an event loop of its own: who goes to
the model at once, who waits, who gets a freed slot, each project's share of the gateway's places, and that a
waiter who leaves (timed out, cancelled, or granted in the instant it gave up) never leaks a slot nor keeps one.
Through the app with two projects' keys: test_projects_gateway.py; replicas: test_fair_share_replicas.py and
test_projects_gateway_replicas.py."""

from __future__ import annotations

import asyncio

import pytest
from fair_turns import _contended, _many, _settle, _waiter

from pipelines.admission.fair import FairShare
from pipelines.gateway import openai_api as api


def test_a_freed_slot_goes_to_the_waiting_project_with_fewest_at_the_model_then_the_least_recently_served() -> None:
    """Two slots: a then b hold one each, a queues before b. When b's slot frees, b (none at the model) gets it,
    though a waited longer and was served longer ago. (Mutation tried: turns by recency alone hand it to a.)"""

    async def main() -> list[str]:
        fair, got = _contended(2), []
        assert await fair.acquire("a") == 0.0 and await fair.acquire("b") == 0.0
        tasks = [asyncio.create_task(_waiter(fair, "a", got))]
        await _settle()
        tasks.append(asyncio.create_task(_waiter(fair, "b", got)))
        await _settle()
        assert fair.snapshot()["waiting"] == 2 and got == []
        fair.release("b")
        await _settle()
        assert got == ["b"] and fair.at_model == {"a": 1, "b": 1}
        fair.release("a")
        await asyncio.gather(*tasks)
        return got

    assert asyncio.run(main()) == ["b", "a"]


def test_a_quiet_project_goes_to_the_model_at_once_while_a_busy_one_waits_beyond_its_slots() -> None:
    """One slot while two projects send: a busy project's second and later requests wait; the quiet project's
    request goes at once (every sending project may have one at the model), its second waits like any other.
    (Mutations tried: first come, first served; no place for a project with none at the model.)"""

    async def main() -> None:
        fair, got = _contended(1), []
        assert await fair.acquire("a") == 0.0
        busy = [asyncio.create_task(_waiter(fair, "a", got)) for _ in range(3)]
        await _settle()
        assert fair.snapshot()["waiting"] == 3
        assert await asyncio.wait_for(fair.acquire("b"), 1) == 0.0  # behind nobody's queue
        second = asyncio.create_task(_waiter(fair, "b", got))
        await _settle()
        assert not second.done() and fair.at_model == {"a": 1, "b": 1}
        fair.release("a")  # a's next takes a's place, b keeps its one
        await _settle()
        assert got == ["a"]
        fair.release("b")
        await _settle()
        assert got == ["a", "b"]
        assert fair.at_model == {"a": 1, "b": 1}
        fair.release("a")
        await _settle()
        fair.release("a")
        await asyncio.wait_for(asyncio.gather(*busy, second), 5)
        assert got == ["a", "b", "a", "a"] and fair.at_model == {"a": 1, "b": 1} and not fair.waiting

    asyncio.run(main())


def test_a_project_alone_is_never_held_back_and_the_turns_start_and_end_with_the_second_project() -> None:
    """One slot: a project alone sends five at once, none waits (Triton batches them as before). Once b sends,
    the turns are on: b goes at once, a's next waits until a is below its slots. When b has been quiet for
    `window_s` with nothing at the model, a's waiting request goes with a's next call. (Mutations tried: the
    cap applied with one project holds a's five; contention never ending leaves a's waiter queued.)"""

    async def main() -> None:
        now = [0.0]
        fair = FairShare(1, 5, window_s=10)
        fair.clock = lambda: now[0]
        assert await _many(fair, "a", 5) == [0.0] * 5 and fair.busy == 5 and not fair.contended()
        assert await fair.acquire("b") == 0.0 and fair.contended()
        got: list[str] = []
        late = asyncio.create_task(_waiter(fair, "a", got))
        await _settle()
        for _ in range(4):
            fair.release("a")
        await _settle()
        assert got == [] and fair.at_model == {"a": 1, "b": 1}
        fair.release("b")  # b's request ends; b counts as sending for the window still
        await _settle()
        assert got == [] and fair.contended()
        now[0] = 30.0  # b quiet for longer than the window: a alone again
        assert await fair.acquire("a") == 0.0
        await asyncio.wait_for(late, 1)
        assert got == ["a"] and fair.busy == 3 and not fair.contended()

    asyncio.run(main())


def test_a_project_at_the_model_keeps_the_turns_on_past_the_window() -> None:
    """A project whose request is still being answered counts as sending however long ago it sent. (Mutation
    tried: pruning by time alone lets the other project's waiting request through.)"""

    async def main() -> None:
        now = [0.0]
        fair = FairShare(1, 60, window_s=10)
        fair.clock = lambda: now[0]
        assert await fair.acquire("a") == 0.0 and await fair.acquire("b") == 0.0
        now[0] = 5.0
        a_next = asyncio.create_task(fair.acquire("a"))
        await _settle()
        now[0] = 12.0  # b's request is 12 s old and still at the model
        fair._dispatch()  # what the window's timer does
        await _settle()
        assert fair.contended() and not a_next.done()
        fair.release("b")
        now[0] = 30.0
        fair._dispatch()
        await asyncio.wait_for(a_next, 1)

    asyncio.run(main())


def test_while_projects_share_the_gateway_each_holds_at_most_its_share_of_the_places() -> None:
    """max_concurrent_requests 8 and two projects sending: 4 places each, the fifth of one project a 429 with
    Retry-After while the other still gets in; alone, a project may take all 8; with the turns off, no share.
    (Mutation tried: no share: the flood takes every place.)"""
    fair = FairShare(1, 5)
    for _ in range(8):
        fair.enter("a", 8)  # alone: every place
    for _ in range(8):
        fair.leave("a")
    assert fair.places == {}
    fair.enter("b", 8)
    for _ in range(3):
        fair.enter("a", 8)
    fair.enter("a", 8)
    with pytest.raises(api.ApiError) as refused:
        fair.enter("a", 8)
    assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
    assert "its share of 8" in refused.value.message and fair.places == {"a": 4, "b": 1}
    fair.enter("b", 8)
    fair.leave("a")
    fair.enter("a", 8)  # a place freed is a place again
    now = [fair.clock() + 60]  # b quiet for a minute with nothing in the gateway: a sends alone again ...
    fair.clock = lambda: now[0]
    fair.leave("b")
    fair.leave("b")
    for _ in range(2):
        fair.enter("a", 8)
    with pytest.raises(api.ApiError):  # ... and keeps 2 of 8 free for the quiet project's return
        fair.enter("a", 8)
    assert fair.places == {"a": 6} and fair.share(8) == 6
    off = FairShare(0, 5)
    off.enter("b", 8)
    for _ in range(8):
        off.enter("a", 8)


def test_the_waiting_go_on_their_own_when_the_other_project_goes_quiet() -> None:
    """Nobody calls after the other project's last request ends: the gateway's own timer ends the turns when
    that project's window runs out, and the waiting request goes. (Mutation tried: no timer: it waits until
    its queue timeout.)"""

    async def main() -> None:
        fair = FairShare(1, 5, window_s=1.0)  # long enough that a stalled worker still sees the turns on
        assert await fair.acquire("a") == 0.0 and await fair.acquire("b") == 0.0
        waiter = asyncio.create_task(fair.acquire("a"))
        await _settle()
        fair.release("b")
        await _settle()
        assert not waiter.done() and fair.contended()
        assert await asyncio.wait_for(waiter, 5) >= 750  # about the window, then it went

    asyncio.run(main())


def test_a_waiter_that_times_out_or_is_cancelled_leaves_the_queue_and_a_late_grant_is_given_back() -> None:
    async def main() -> None:
        fair = _contended(1, 0.05)
        await fair.acquire("a")
        with pytest.raises(api.ApiError) as refused:
            await fair.acquire("a")  # a's second: over the one slot
        assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
        assert not fair.waiting and fair.counts["timed_out"] == 1
        fair.timeout_s = 5
        task = asyncio.create_task(fair.acquire("a"))
        await _settle()
        task.cancel()  # the caller left while waiting
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not fair.waiting
        task = asyncio.create_task(fair.acquire("a"))
        await _settle()
        fair.release("a")  # the waiter is granted ...
        task.cancel()  # ... and leaves in the same instant, before it ran: it holds the slot or gave it back
        try:
            await task
            fair.release("a")  # (Python 3.11's wait_for returns a result that came with the cancellation)
        except asyncio.CancelledError:
            pass
        assert fair.busy == 0 and not fair.at_model
        fair.release("a")  # a slot given back twice: ignored, nothing goes negative
        assert fair.busy == 0 and not fair.at_model
        assert await fair.acquire("c") == 0.0 and fair.busy == 1  # nothing leaked

    asyncio.run(main())


def test_no_slots_means_no_turns() -> None:
    async def main() -> None:
        fair = FairShare(0, 1)
        fair._seen["z"] = fair.clock()
        assert [await fair.acquire("a") for _ in range(50)] == [None] * 50 and fair.busy == 0

    asyncio.run(main())


def test_unset_slots_follow_the_shared_base_one_per_instance_on_cpu_a_batch_on_gpu_off_without_it(tmp_path) -> None:
    from pipelines.admission.fair import backend_slots
    from pipelines.config import load_settings

    def slots(**triton) -> int:
        return backend_slots(load_settings(root=str(tmp_path), triton=triton))

    assert slots() == 0  # each project's versions are their own Triton models
    assert slots(multi_lora=True, instances=2) == 2
    assert slots(multi_lora=True, instances=2, instance_kind="KIND_GPU", max_batch_size=16) == 32
    assert (
        backend_slots(load_settings(root=str(tmp_path), triton={"multi_lora": True}, gateway={"backend_slots": 0})) == 0
    )


def test_a_project_whose_answers_outlast_the_window_still_sends_when_one_ends() -> None:
    """The noisy-neighbour bench's shape: the quiet project sends one request after another, each answered after
    more than the window; when one ends (the app gives the place back, then the slot), the flooding project's
    waiting requests do not all go to the model in that instant: the turns hold until the quiet project's next
    request. (Mutation tried: no refresh at release: busy 4, the waiting all went; found by
    bench/projects.py, where the model held 4-5 requests under the turns.)"""

    async def main() -> None:
        now = [0.0]
        fair = FairShare(1, 60, window_s=10)
        fair.clock = lambda: now[0]
        fair.enter("search", 8)
        assert await fair.acquire("search") == 0.0
        for _ in range(4):
            fair.enter("shop", 8)
        assert await fair.acquire("shop") == 0.0  # each sending project has one at the model
        waiting = [asyncio.create_task(fair.acquire("shop")) for _ in range(3)]
        await _settle()
        assert fair.busy == 2 and len(fair.waiting["shop"]) == 3
        now[0] = 14.0  # search's answer took 14 s: longer than the window
        fair.leave("search")  # the app's order: the place, then the slot
        fair.release("search")
        await _settle()
        assert fair.busy == 1 and fair.contended() and not any(w.done() for w in waiting), fair.snapshot()
        now[0] = 14.05  # search's next request goes at once, shop's still wait
        fair.enter("search", 8)
        assert await fair.acquire("search") == 0.0 and fair.busy == 2
        now[0] = 20.0  # its answer; then search sends nothing more
        fair.leave("search")
        fair.release("search")
        await _settle()
        assert not any(w.done() for w in waiting) and fair.contended()  # its window runs from the answer
        now[0] = 30.02  # the window after its last answer is over: the turns end, the waiting go
        fair._dispatch()  # what the window's timer does
        await _settle()
        assert all(w.done() for w in waiting) and not fair.contended(), fair.snapshot()

    asyncio.run(main())
