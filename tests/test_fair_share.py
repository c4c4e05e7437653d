"""The gateway's turns at the shared model (pipelines/gateway/fair.py), on an event loop of its own: who gets a
freed slot, and that a waiter who leaves (timed out, cancelled, or granted in the instant it gave up) never
leaks a slot nor keeps one. Through the app with two projects' keys: test_projects_gateway.py."""

from __future__ import annotations

import asyncio

import pytest

from pipelines.gateway import openai_api as api
from pipelines.gateway.fair import FairShare


async def _waiter(fair: FairShare, project: str, got: list[str]) -> None:
    await fair.acquire(project)
    got.append(project)


def _contended(slots: int, timeout_s: float = 5) -> FairShare:
    """A FairShare where another project ("z") has just sent a request: the turns are on."""
    fair = FairShare(slots, timeout_s)
    fair._seen["z"] = fair.clock()
    return fair


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


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


def test_equal_projects_take_turns_and_a_project_alone_gets_every_slot() -> None:
    async def main() -> list[str]:
        fair, got = _contended(1), []
        await fair.acquire("a")
        tasks = []
        for project in ("a", "a", "a", "b", "b"):
            tasks.append(asyncio.create_task(_waiter(fair, project, got)))
            await _settle()
        for _ in range(5):
            fair.release(got[-1] if got else "a")
            await _settle()
        await asyncio.gather(*tasks)
        fair.release(got[-1])
        assert fair.busy == 0 and not fair.waiting and not fair.at_model
        return got

    assert asyncio.run(main()) == ["b", "a", "b", "a", "a"]


def test_a_project_alone_is_never_held_back_and_the_turns_start_and_end_with_the_second_project() -> None:
    """One slot: a project alone sends five at once, none waits (Triton batches them as before). Once b sends,
    the turns are on: b's request and a's next one wait, and b gets the first slot a's requests free below the
    cap. When b has been quiet for `window_s`, a's waiting requests go at once. (Mutations tried: the cap
    applied with one project holds a's five; contention never ending leaves a's waiters queued.)"""
    async def main() -> None:
        now = [0.0]
        fair = FairShare(1, 5, window_s=10)
        fair.clock = lambda: now[0]
        assert await _many(fair, "a", 5) == [0.0] * 5 and fair.busy == 5 and not fair.contended()
        got: list[str] = []
        tasks = [asyncio.create_task(_waiter(fair, "b", got))]
        await _settle()
        tasks.append(asyncio.create_task(_waiter(fair, "a", got)))
        await _settle()
        assert fair.contended() and fair.snapshot()["waiting"] == 2
        for _ in range(4):
            fair.release("a")
        await _settle()
        assert got == [] and fair.busy == 1  # still at the cap
        fair.release("a")
        await _settle()
        assert got == ["b"]
        fair.release("b")
        await _settle()
        assert got == ["b", "a"]
        fair.release("a")
        assert fair.busy == 0
        now[0] = 11.0  # b quiet for longer than the window: a alone again, its requests straight to the model
        assert await _many(fair, "a", 2) == [0.0] * 2 and not fair.contended()
        b = asyncio.create_task(fair.acquire("b"))  # b is back: the turns are on, a is over the cap
        await _settle()
        late = [asyncio.create_task(_waiter(fair, "a", got)) for _ in range(2)]
        await _settle()
        assert fair.snapshot()["waiting"] == 3 and fair.contended()
        fair.release("a")
        fair.release("a")
        await _settle()
        assert b.done() and fair.at_model == {"b": 1}
        fair.release("b")  # b's last request ends; it counts as active for the window still
        await _settle()
        assert fair.busy == 1 and fair.snapshot()["waiting"] == 1
        now[0] = 30.0  # b quiet for longer than the window: a's waiting request goes with its next one
        assert await fair.acquire("a") == 0.0
        await asyncio.gather(*tasks, *late)
        assert fair.busy == 3 and not fair.waiting

    asyncio.run(main())


def test_a_project_at_the_model_or_waiting_keeps_the_turns_on_past_the_window() -> None:
    """A project whose request is still at the model, or still waiting, counts as sending however long ago it
    sent: the other project's next request waits its turn. (Mutation tried: pruning by time alone lets it
    straight through.)"""
    async def main() -> None:
        now = [0.0]
        fair = FairShare(1, 60, window_s=10)
        fair.clock = lambda: now[0]
        assert await fair.acquire("a") == 0.0
        b = asyncio.create_task(fair.acquire("b"))
        await _settle()
        now[0] = 20.0  # b waiting for 20 s (a long answer of a's)
        a_next = asyncio.create_task(fair.acquire("a"))
        await _settle()
        assert not b.done() and not a_next.done() and fair.busy == 1
        fair.release("a")
        await _settle()
        assert b.done() and not a_next.done()  # b's turn first
        now[0] = 45.0  # b at the model for 25 s
        a_more = asyncio.create_task(fair.acquire("a"))
        await _settle()
        assert not a_more.done() and fair.busy == 1
        fair.release("b")
        await asyncio.wait_for(asyncio.gather(a_next, a_more), 5)  # b gone quiet: a alone again, both go
        assert fair.busy == 2

    asyncio.run(main())


async def _many(fair: FairShare, project: str, n: int) -> list[float | None]:
    return [await fair.acquire(project) for _ in range(n)]


def test_a_waiter_that_times_out_or_is_cancelled_leaves_the_queue_and_a_late_grant_is_given_back() -> None:
    async def main() -> None:
        fair = _contended(1, 0.05)
        await fair.acquire("a")
        with pytest.raises(api.ApiError) as refused:
            await fair.acquire("b")
        assert refused.value.status == 429 and refused.value.headers == {"Retry-After": "1"}
        assert not fair.waiting and fair.counts["timed_out"] == 1
        fair.timeout_s = 5
        task = asyncio.create_task(fair.acquire("b"))
        await _settle()
        task.cancel()  # the caller left while waiting
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not fair.waiting
        task = asyncio.create_task(fair.acquire("b"))
        await _settle()
        fair.release("a")  # b is granted ...
        task.cancel()  # ... and leaves in the same instant, before it ran: it holds the slot or gave it back
        try:
            await task
            fair.release("b")  # (Python 3.11's wait_for returns a result that came with the cancellation)
        except asyncio.CancelledError:
            pass
        assert fair.busy == 0 and not fair.at_model
        assert await fair.acquire("c") == 0.0  # a slot is free at once: nothing leaked

    asyncio.run(main())


def test_no_slots_means_no_queue() -> None:
    async def main() -> None:
        fair = FairShare(0, 1)
        assert [await fair.acquire("a") for _ in range(50)] == [None] * 50 and fair.busy == 0

    asyncio.run(main())


def test_unset_slots_are_one_per_instance_on_cpu_and_a_full_batch_per_instance_on_gpu(tmp_path) -> None:
    from pipelines.config import load_settings
    from pipelines.gateway.fair import backend_slots

    assert backend_slots(load_settings(root=str(tmp_path), triton={"instances": 2})) == 2
    assert backend_slots(load_settings(root=str(tmp_path), triton={"instances": 2, "instance_kind": "KIND_GPU",
                                                                    "max_batch_size": 16})) == 32
    assert backend_slots(load_settings(root=str(tmp_path), gateway={"backend_slots": 0})) == 0
