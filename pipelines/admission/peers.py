"""The fair turns across gateway replicas: each replica tells the others which projects send to it.

The turns at the shared model (`fair.py`) are kept by each gateway replica on its own event loop; the cluster
runs two replicas, and the balancer spreads connections, not projects. Alone, a replica that only sees the
flooding project would think it alone and send its whole flood to Triton, where the quiet project's request,
sent through the other replica, waits behind all of it. So every `gateway.turns_exchange_s` (5 s; 0: off)
each replica writes what its turns
know (`FairShare.state`: the projects sending to it, whether each still has requests here, and its demand:
requests at the model or waiting) to `<serving zone>/gateway/turns/<replica>.json`, atomically, and reads the
others' (`FairShare.learn`): a project sending through any live replica counts as sending on every replica, and
the model's slots (`gateway.backend_slots`, the model's, not one replica's) are split between the replicas with
demand, in proportion to it (at least one each). What a replica knows of the others is up to about two periods
old (~10 s); a file older than its live span (three of its writer's cycles: a stopped replica) counts nothing,
and one older than an hour is removed. A replica that stops removes its own file.
The replicas' clocks must agree to within a few seconds (NTP): a file written more than a minute ahead is
left out.

The file I/O runs in a daemon thread with a timeout (a stuck store never holds the gateway's exit); the turns
are only read and changed on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipelines.admission.fair import FairShare
    from pipelines.config import Settings

LOG = logging.getLogger("flywheel.gateway")
IO_TIMEOUT_S = 30.0  # one exchange's file I/O: a warning past it (object storage)
STOP_WAIT_S = 5.0  # at shutdown: for the exchange in flight, then for the file's removal
MAX_AHEAD_S = 60.0  # a file written further in the future than this (a replica's clock off): left out
FORGET_S = 3600.0  # a replica's file older than this is removed (a pod rescheduled under a new name)


def _turns_dir(settings: Settings) -> str:
    return f"{settings.zone('serving')}/gateway/turns"


def turns_uri(settings: Settings, replica: str) -> str:
    return f"{_turns_dir(settings)}/{replica}.json"


def check(record: Any) -> dict[str, Any]:
    """A replica's turns record, or ValueError / TypeError when it is not one."""
    if not isinstance(record, dict) or not isinstance(record.get("sending"), dict):
        raise TypeError("not a turns record (a dict with `sending`)")
    at, live_s, demand = float(record["at"]), float(record["live_s"]), int(record["demand"])
    if not (math.isfinite(at) and math.isfinite(live_s) and live_s > 0 and demand >= 0):
        raise ValueError(f"at {at}, live_s {live_s}, demand {demand}: not a time, a span and a count")
    sending = {}
    for project, info in record["sending"].items():
        seen = float(info["seen"])
        if not isinstance(project, str) or not math.isfinite(seen) or not isinstance(info.get("held"), bool):
            raise ValueError(f"sending {project!r}: {info!r} is not a time and a held flag")
        sending[project] = {"seen": seen, "held": info["held"]}
    return {"at": at, "live_s": live_s, "demand": demand, "sending": sending}


def exchange(settings: Settings, replica: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """Write this replica's turns, read the other replicas' live ones. A failed write is logged (the others
    then count this replica's last file until it ages out); an unreadable file is logged and left out."""
    from pipelines.storage import glob, read_json, remove, write_json

    try:
        write_json(turns_uri(settings, replica), state)
    except Exception as exc:  # noqa: BLE001 (an object store's own errors too)
        LOG.warning("the gateway's turns not written: %s", exc)
    wall, found = time.time(), []
    mine = turns_uri(settings, replica).rsplit("/", 1)[-1]
    for uri in glob(f"{_turns_dir(settings)}/*.json"):
        if uri.rsplit("/", 1)[-1] == mine:
            continue
        try:
            record = check(read_json(uri))
            if record["at"] - wall > MAX_AHEAD_S:
                raise ValueError(f"written {record['at'] - wall:.0f} s in the future (the replicas' clocks differ)")
        except Exception as exc:  # noqa: BLE001 (unreadable, not a turns record, or the store's own error)
            LOG.warning("turns %s unreadable: %s", uri, exc)
            continue
        age = wall - record["at"]
        if age < record["live_s"]:
            found.append(record)
        elif age > FORGET_S:
            try:
                remove(uri)
            except Exception as exc:  # noqa: BLE001 (the store's own errors too): the others' records still count
                LOG.warning("turns %s not removed: %s", uri, exc)
    return found


def withdraw(settings: Settings, replica: str) -> None:
    """This replica's file removed (it stops): the others stop counting it at once."""
    from pipelines.storage import exists, remove

    uri = turns_uri(settings, replica)
    try:
        if exists(uri):
            remove(uri)
    except Exception as exc:  # noqa: BLE001 (an object store's own errors too): the file ages out by itself
        LOG.warning("turns %s not removed: %s (the others stop counting it when it ages out)", uri, exc)


def _in_daemon(fn: Any, *args: Any) -> asyncio.Future[Any]:
    """`fn(*args)` in a daemon thread, its result as a future of the running loop. Not the loop's default
    executor: that one is joined without a timeout when the gateway's loop closes, so a call stuck in object
    storage would hold the process's exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 (handed to the loop as an error a future can hold)
            error = (
                exc
                if isinstance(exc, Exception) and not isinstance(exc, StopIteration)
                else RuntimeError(f"{type(exc).__name__}: {exc}")
            )
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile: nobody waits for it
            pass

    threading.Thread(target=run, name="gateway-turns", daemon=True).start()
    return future


class InStep:
    """One replica's exchange loop: `start` on the gateway's event loop, `stop` (bounded) at its shutdown. At most
    one exchange runs at a time (one stuck in object storage: no new one until it ends, logged every
    IO_TIMEOUT_S); the turns are read and changed on the loop only."""

    def __init__(self, fair: FairShare, settings: Settings, replica: str) -> None:
        self.fair, self.settings, self.replica = fair, settings, replica
        self.every = settings.gateway.turns_exchange_s
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._io: asyncio.Future[list[dict[str, Any]]] | None = None  # the exchange's thread while it runs

    def start(self) -> None:
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        if self._stop is None:
            raise RuntimeError("the exchange was never started")
        cycle = self.every
        while not self._stop.is_set():
            started = time.monotonic()
            if self._io is None:
                try:
                    state = {
                        **self.fair.state(),
                        "at": time.time(),
                        "live_s": 3 * max(cycle, self.every),
                        "replica": self.replica,
                    }
                    self._io = _in_daemon(exchange, self.settings, self.replica, state)
                except Exception:  # noqa: BLE001 (the turns go on with what this replica knows)
                    LOG.exception("the gateway's turns: not exchanged")
            if self._io is not None:
                done, _ = await asyncio.wait({self._io}, timeout=IO_TIMEOUT_S)
                if done:
                    io, self._io = self._io, None
                    try:
                        found = io.result()
                    except Exception:  # noqa: BLE001 (the others' last known state ages out)
                        LOG.exception("the gateway's turns: exchange failed")
                    else:
                        try:
                            self.fair.learn(found, time.time())
                        except Exception:  # noqa: BLE001 (the turns go on with what they knew)
                            LOG.exception("the gateway's turns: the others' state not applied")
                else:
                    LOG.warning(
                        "the gateway's turns: no exchange within %s s (the others' last known state ages "
                        "out; no new exchange until this one ends)",
                        IO_TIMEOUT_S,
                    )
            try:
                await asyncio.wait_for(self._stop.wait(), self.every)
            except TimeoutError:
                pass
            cycle = time.monotonic() - started

    async def stop(self) -> None:
        """The loop ended and this replica's file removed, within about 2 x STOP_WAIT_S: an exchange in flight
        ends first (else the file is left to age out: its write could land after the removal)."""
        if self._stop is None or self._task is None:
            return
        self._stop.set()
        pending = {t for t in (self._task, self._io) if t is not None and not t.done()}
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT_S)
        if not self._task.done():
            self._task.cancel()
        elif not self._task.cancelled() and self._task.exception() is not None:
            LOG.error("the gateway's turns: the exchange loop ended", exc_info=self._task.exception())
        if self._io is not None and not self._io.done():
            LOG.warning("the gateway's turns: an exchange still running at stop; the file is left to age out")
            return
        try:
            await asyncio.wait_for(_in_daemon(withdraw, self.settings, self.replica), STOP_WAIT_S)
        except TimeoutError:
            LOG.warning("the gateway's turns file not removed within %s s (it ages out)", STOP_WAIT_S)
