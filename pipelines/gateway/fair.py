"""Fair turns at the shared model: one project's burst waits behind its own requests, not in front of others'.

Every project's adapters are answered by the same model servers (one Triton base with `triton.multi_lora`).
Triton queues what it is sent first come, first served, so a project sending twenty requests at once put a
quiet project's one request behind all twenty. While two or more projects send requests (each within the last
`gateway.fair_window_s`), the gateway therefore sends the model servers at most `gateway.backend_slots`
completions at once (`backend_slots`: one per Triton instance on CPU, where a batch answers no more per second
than one request at a time); the others wait here, one queue per project, and a freed slot goes to the waiting
project with the fewest completions at the model (ties: the one served least recently). Max-min fair: two busy
projects get half each; a quiet project's request waits for one slot to free, never for a busy project's whole
queue. A project alone is never held back (its requests go straight to Triton, batched there as before). A
request that waits longer than `gateway.queue_timeout_s` is refused with an OpenAI-style 429 and `Retry-After`
(nothing was sent to the model, nothing is captured). `backend_slots: 0` turns the queue off.

How many places a project may hold in the gateway itself (waiting or answered) is its quota's `concurrent`
(`flywheel project quota NAME --concurrent N`); `gateway.max_concurrent_requests` bounds them all.
Everything here runs on the gateway's event loop: no locks, no thread ever touches it.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import defaultdict, deque
from typing import Any

from pipelines.gateway import openai_api as api


def backend_slots(settings: Any) -> int:
    """`gateway.backend_slots`, or when unset what the model servers answer at once without slowing down: one
    request per Triton instance on CPU (a batch of seven there answered no more per second than one at a time),
    a full batch per instance on GPU."""
    if settings.gateway.backend_slots is not None:
        return int(settings.gateway.backend_slots)
    triton = settings.triton
    return triton.instances * (triton.max_batch_size if triton.instance_kind == "KIND_GPU" else 1)


class FairShare:
    """The model servers' slots, handed out in fair turns by project (see the module's doc)."""

    def __init__(self, slots: int, timeout_s: float, window_s: float = 10.0) -> None:
        self.slots, self.timeout_s, self.window_s = slots, timeout_s, window_s
        self.clock = time.monotonic
        self._seen: dict[str, float] = {}  # each project's latest request
        self.busy = 0
        self.at_model: dict[str, int] = defaultdict(int)
        self.waiting: dict[str, deque[asyncio.Future[None]]] = defaultdict(deque)
        self._turn = itertools.count()
        self._last: dict[str, int] = {}  # the turn a project was last given a slot
        self.counts = {"granted": 0, "waited": 0, "timed_out": 0}  # all projects' (per project: their usage)

    def _give(self, project: str) -> None:
        self.busy += 1
        self.at_model[project] += 1
        self._last[project] = next(self._turn)
        self.counts["granted"] += 1

    def _next(self) -> str | None:
        """The waiting project whose turn it is: fewest at the model, then served least recently."""
        ready = [p for p, queue in self.waiting.items() if queue]
        if not ready:
            return None
        return min(ready, key=lambda p: (self.at_model.get(p, 0), self._last.get(p, -1)))

    def contended(self) -> bool:
        """Whether two or more projects sent requests within the last `window_s`."""
        horizon = self.clock() - self.window_s
        for project in [p for p, at in self._seen.items()
                        if at < horizon and p not in self.at_model and p not in self.waiting]:
            del self._seen[project]
        return len(self._seen) >= 2

    def _cap(self) -> float:
        return self.slots if self.contended() else math.inf

    def _dispatch(self) -> None:
        while self.busy < self._cap():
            project = self._next()
            if project is None:
                return
            future = self.waiting[project].popleft()
            if not self.waiting[project]:
                del self.waiting[project]
            self._give(project)
            future.set_result(None)

    async def acquire(self, project: str) -> float | None:
        """Wait for a slot at the model, at most `timeout_s` (then a 429 ApiError). The milliseconds waited when
        a slot is held (give it back with `release`), None when the queue is off."""
        if self.slots <= 0:
            return None
        self._seen[project] = self.clock()
        self._dispatch()  # the waiting first, should the cap have risen (the other projects went quiet)
        if self.busy < self._cap() and not self.waiting:
            self._give(project)
            return 0.0
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.waiting[project].append(future)
        started = loop.time()
        self.counts["waited"] += 1
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout=self.timeout_s)
        except BaseException as exc:  # timed out, or the caller left while waiting
            if future.done() and not future.cancelled():
                self.release(project)  # granted in the same instant: given back, the next in turn gets it
            else:
                future.cancel()
                self._forget(project, future)
            if isinstance(exc, asyncio.TimeoutError):
                self.counts["timed_out"] += 1
                raise api.ApiError(429, f"project {project} waited {self.timeout_s:g} s for a turn at the model "
                                        f"(gateway.queue_timeout_s; {self.slots} completions at once, shared by every "
                                        "project); retry after a second", kind="rate_limit_error",
                                   code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None
            raise
        return (loop.time() - started) * 1000

    def _forget(self, project: str, future: asyncio.Future[None]) -> None:
        queue = self.waiting.get(project)
        if queue is not None:
            try:
                queue.remove(future)
            except ValueError:
                pass
            if not queue:
                del self.waiting[project]

    def release(self, project: str) -> None:
        """Give a slot back; the next project in turn gets it."""
        self.busy -= 1
        self.at_model[project] -= 1
        if self.at_model[project] <= 0:
            del self.at_model[project]
        self._dispatch()

    def snapshot(self) -> dict[str, Any]:
        """What /ready shows (an open path: totals only, no project's name): slots, busy, waiting, counts."""
        return {"slots": self.slots, "busy": self.busy, "waiting": sum(len(q) for q in self.waiting.values()),
                "contended": self.contended(), **self.counts}
