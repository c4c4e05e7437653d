"""Shared by the fair-share tests: a FairShare whose slots are taken, and coroutines that wait for a turn."""

from __future__ import annotations

import asyncio

from pipelines.admission.fair import FairShare


def _contended(slots: int, timeout_s: float = 5) -> FairShare:
    """A FairShare where another project ("z") has just sent a request: the turns are on."""
    fair = FairShare(slots, timeout_s)
    fair._seen["z"] = fair.clock()
    return fair


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def _waiter(fair: FairShare, project: str, got: list[str]) -> None:
    await fair.acquire(project)
    got.append(project)


async def _many(fair: FairShare, project: str, n: int) -> list[float | None]:
    return [await fair.acquire(project) for _ in range(n)]
