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


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_freed_slot_goes_to_the_waiting_project_with_fewest_at_the_model_then_the_least_recently_served() -> None:
    """Two slots: a then b hold one each, a queues before b. When b's slot frees, b (none at the model) gets it,
    though a waited longer and was served longer ago. (Mutation tried: turns by recency alone hand it to a.)"""
    async def main() -> list[str]:
        fair, got = FairShare(2, 5), []
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
        fair, got = FairShare(1, 5), []
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
    alone = FairShare(3, 0.05)
    assert asyncio.run(_many(alone, "c", 3)) == [0.0] * 3 and alone.at_model == {"c": 3}  # a project alone: every slot


async def _many(fair: FairShare, project: str, n: int) -> list[float | None]:
    return [await fair.acquire(project) for _ in range(n)]


def test_a_waiter_that_times_out_or_is_cancelled_leaves_the_queue_and_a_late_grant_is_given_back() -> None:
    async def main() -> None:
        fair = FairShare(1, 0.05)
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
