"""Fair turns at the shared model: one project's burst waits behind its own requests, not in front of others'.

Every project's adapters are answered by the same model servers (one Triton base with `triton.multi_lora`).
Triton answers what it is sent first come, first served, so a project sending twenty requests at once put a
quiet project's one request behind all twenty. While two or more projects send requests (each within the last
`gateway.fair_window_s`, or still waiting or answered), the gateway keeps its own turns:
- every sending project may have one completion at the model at once, whatever the others hold; beyond that
  at most `gateway.backend_slots` are at the model (`backend_slots`: with `triton.multi_lora`, one per Triton
  instance on CPU, where a batch answers no more per second than one request at a time, a full batch per
  instance on GPU; without it 0, off: each project's versions are their own Triton models). The others wait
  here, one queue per project, and a freed slot goes to the waiting project with the fewest completions at the
  model (ties: the one served least recently). A quiet project's request therefore never waits in the gateway:
  it joins the model's queue at once, behind only what was sent before it;
- each project may hold at most its share of the gateway's places (`gateway.max_concurrent_requests` divided
  by the projects sending, at least 1), waiting or answered; past it, a 429 with `Retry-After`; a project
  sending alone keeps a quarter of the places free once the gateway has served another project, so a flood
  cannot take every place and leave the quiet project the gateway's own 429.
A project alone is never held back at the model (its requests go straight to Triton, batched there as before):
when a quiet project comes back, what the busy one had already sent is ahead of it (once per quiet spell: a
project counts as sending for `fair_window_s` after its latest request was sent or answered). A request that
waits longer than `gateway.queue_timeout_s` is refused with an OpenAI-style 429 and `Retry-After` (nothing
was sent to the model, nothing is captured). `backend_slots: 0` turns the turns off.

Across gateway replicas (the cluster runs two; `peers.py`): each replica keeps its own turns and queues, and
every few seconds tells the others which projects send to it and how many of its requests are at the model or
waiting. A project sending through another replica counts as sending here too (so a replica that only sees the
flood still holds it to its slots), and the model's `backend_slots` are split between the replicas in
proportion to their demand, at least one each (so the replicas together may send one more per replica, and
one per sending project, than `backend_slots`). A replica's places stay its own: only the projects sending
through it share them (one seen elsewhere keeps the quarter free). What a replica knows of the others is up
to ~10 s old.

A project's own quota (`flywheel project quota NAME --rpm/--concurrent`) still applies first. Everything here
runs on the gateway's event loop: no locks, no thread ever touches it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

from pipelines import api_errors as api

if TYPE_CHECKING:
    from pipelines.config import Settings

LOG = logging.getLogger("flywheel.gateway")


def backend_slots(settings: Settings) -> int:
    """`gateway.backend_slots`, or when unset: with `triton.multi_lora` what the shared model answers at once
    without slowing down (one request per Triton instance on CPU: a batch of seven there answered no more per
    second than one at a time; a full batch per instance on GPU), else 0 (off: each project's own models)."""
    if settings.gateway.backend_slots is not None:
        return int(settings.gateway.backend_slots)
    triton = settings.triton
    if not triton.multi_lora:
        return 0
    return triton.instances * (triton.max_batch_size if triton.instance_kind == "KIND_GPU" else 1)


class FairShare:
    """The model servers' slots, handed out in fair turns by project (see the module's doc)."""

    def __init__(self, slots: int, timeout_s: float, window_s: float = 10.0) -> None:
        self.slots, self.timeout_s, self.window_s = slots, timeout_s, window_s
        self.clock = time.monotonic
        self._seen: dict[str, float] = {}  # when each project's latest request was sent or answered
        self.places: dict[str, int] = {}  # each project's requests in the gateway (waiting or answered)
        self._known: set[str] = set()  # every project this gateway has seen (one alone keeps no reserve)
        self._timer: asyncio.TimerHandle | None = None
        self.busy = 0
        self.at_model: dict[str, int] = defaultdict(int)
        self.waiting: dict[str, deque[asyncio.Future[None]]] = defaultdict(deque)
        self._turn = itertools.count()
        self._last: dict[str, int] = {}  # the turn a project was last given a slot
        self.counts = {"granted": 0, "waited": 0, "timed_out": 0, "refused_places": 0}  # all projects' together
        self._elsewhere: dict[str, float] = {}  # projects sending through other replicas: until when (clock)
        self._peers: list[tuple[float, int]] = []  # each other replica's (until when it counts, its demand)

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

    def sending(self) -> int:
        """How many projects send: a request sent or answered within the last `window_s`, or one waiting or at the
        model now, here or through another replica (as it last told)."""
        now = self.clock()
        horizon = now - self.window_s
        for project in [
            p
            for p, at in self._seen.items()
            if at < horizon and p not in self.at_model and p not in self.waiting and p not in self.places
        ]:
            del self._seen[project]
        return len(self._seen.keys() | {p for p, until in self._elsewhere.items() if until > now})

    def sending_here(self) -> int:
        """How many projects send through this replica (the others' not counted: this replica's places are its own)."""
        self.sending()  # the quiet ones pruned
        return len(self._seen)

    def contended(self) -> bool:
        return self.slots > 0 and self.sending() >= 2

    def _may_go(self, project: str) -> bool:
        """Whether a request of `project` may go to the model now: nobody is held back while one project sends;
        every sending project may have one at the model; beyond that, `slots` at once."""
        return self.at_model.get(project, 0) == 0 or self.busy < self.budget() or not self.contended()

    def demand(self) -> int:
        """This replica's requests at the model or waiting for it."""
        return self.busy + sum(len(queue) for queue in self.waiting.values())

    def peer_demand(self) -> int:
        """The other replicas' requests at the model or waiting, as they last told (while their news is live)."""
        now = self.clock()
        return sum(demand for until, demand in self._peers if until > now)

    def budget(self) -> int:
        """The slots this replica may fill: all of them alone; with other replicas' demand, its share in proportion
        to its own demand (at least one)."""
        others = self.peer_demand()
        if others <= 0:
            return self.slots
        mine = self.demand()
        return max(1, math.floor(self.slots * mine / (mine + others)))

    def _dispatch(self) -> None:
        while True:
            project = self._next()  # fewest at the model first: if it may not go, no other may
            if project is None or not self._may_go(project):
                break
            future = self.waiting[project].popleft()
            if not self.waiting[project]:
                del self.waiting[project]
            self._give(project)
            future.set_result(None)
        self._arm()

    def _arm(self) -> None:
        """While requests wait, a dispatch when the next quiet project's window ends (the turns may end then)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.waiting:
            return
        held = set(self.at_model) | set(self.waiting) | set(self.places)
        ends = [at + self.window_s for p, at in self._seen.items() if p not in held]
        ends += [until for p, until in self._elsewhere.items() if p not in held and until > self.clock()]
        if ends:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(max(0.0, min(ends) - self.clock()) + 0.01, self._dispatch)

    def share(self, limit: int) -> int:
        """The places in the gateway one project may hold: `limit` divided by the projects sending through this
        replica (at least 1; a replica's places are its own);
        a project sending alone keeps a quarter of them free (at least 1) once this gateway has served another
        project, so a flood that started alone never holds every place when a quiet project comes back."""
        sending = self.sending_here()
        if sending >= 2:
            return max(1, limit // sending)
        return limit - max(1, limit // 4) if len(self._known) > 1 and limit > 1 else limit

    def enter(self, project: str, limit: int) -> None:
        """A place in the gateway for one request of `project` (give it back with `leave`), at most `share`
        (with the turns on); past it a 429 ApiError."""
        if self.slots > 0:
            self._seen[project] = self.clock()
            self._known.add(project)
            held, share = self.places.get(project, 0), self.share(limit)
            if held >= share:
                self.counts["refused_places"] += 1
                raise api.rate_limited(
                    f"project {project} has {held} requests in the gateway, its share of {limit} "
                    f"(gateway.max_concurrent_requests) while {self.sending_here()} projects send here; "
                    "retry after a second"
                )
        self.places[project] = self.places.get(project, 0) + 1

    def leave(self, project: str) -> None:
        """Give a place back (the turns may end with it: the waiting are looked at again)."""
        held = self.places.get(project, 0)
        if held <= 1:
            self.places.pop(project, None)
        else:
            self.places[project] = held - 1
        if self.waiting:
            self._dispatch()

    async def acquire(self, project: str) -> float | None:
        """Wait for a slot at the model, at most `timeout_s` (then a 429 ApiError). The milliseconds waited when
        a slot is held (give it back with `release`), None when the turns are off."""
        if self.slots <= 0:
            return None
        self._seen[project] = self.clock()
        self._dispatch()  # the waiting first, should they may go now (the other projects went quiet)
        if not self.waiting.get(project) and self._may_go(project):
            self._give(project)
            return 0.0
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.waiting[project].append(future)
        started = loop.time()
        self.counts["waited"] += 1
        self._arm()  # the others may go quiet meanwhile
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
                raise api.rate_limited(
                    f"project {project} waited {self.timeout_s:g} s for a turn at the model "
                    f"(gateway.queue_timeout_s; {self.slots} completions at once, shared by every "
                    "project); retry after a second"
                ) from None
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
        """Give a slot back; the next project in turn gets it. A release without a slot changes nothing."""
        held = self.at_model.get(project, 0)
        if held <= 0:
            LOG.error("a slot of project %s was given back twice (ignored)", project)
            return
        self.busy -= 1
        if held == 1:
            del self.at_model[project]
        else:
            self.at_model[project] = held - 1
        # its window runs from its latest answer too: a project sending one request after another, each longer
        # than the window, still sends when its answer ends (else the turns ended there for an instant, and every
        # request the other project had waiting went to the model at once)
        self._seen[project] = self.clock()
        self._dispatch()

    def snapshot(self) -> dict[str, Any]:
        """The totals the gateway's operator reads (`GET /v1/gateway/queue`, the gateway's own key only)."""
        return {
            "slots": self.slots,
            "busy": self.busy,
            "waiting": sum(len(q) for q in self.waiting.values()),
            "places": sum(self.places.values()),
            "contended": self.contended(),
            **self.counts,
            "peers": sum(until > self.clock() for until, _ in self._peers),
            "peer_demand": self.peer_demand(),
            "budget": self.budget(),
        }

    def state(self) -> dict[str, object]:
        """What this replica tells the others (`peers.py`): the projects sending here (when each was last seen,
        wall clock, and whether it still has requests here) and its demand. Its own knowledge only: what it
        learned of the others is never passed on."""
        self.sending()  # the quiet ones pruned
        now, wall = self.clock(), time.time()
        held = set(self.at_model) | set(self.waiting) | set(self.places)
        return {
            "sending": {p: {"seen": wall - (now - at), "held": p in held} for p, at in self._seen.items()},
            "demand": self.demand(),
        }

    def learn(self, others: list[dict[str, Any]], wall: float) -> None:
        """The other replicas' live states (`peers.check`ed; read at `wall`): a project they hold counts as
        sending here while their file is live, one they saw lately for the rest of its window; their demand
        splits the slots. The waiting are looked at again."""
        now, peers = self.clock(), []
        elsewhere: dict[str, float] = {}
        for other in others:
            expires = now + other["at"] + other["live_s"] - wall
            for project, info in other["sending"].items():
                until = expires if info["held"] else min(expires, now + self.window_s - (wall - info["seen"]))
                if until > now:
                    elsewhere[project] = max(until, elsewhere.get(project, until))
            peers.append((expires, other["demand"]))
        self._elsewhere, self._peers = elsewhere, peers
        self._known.update(elsewhere)
        self._dispatch()
