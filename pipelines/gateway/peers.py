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
old (~10 s); a file older than its live span (three of its writer's cycles: a stopped replica) counts nothing, and one older than an hour is removed. A replica that stops removes its own file.

The file I/O runs in a worker thread with a timeout; the turns are only read and changed on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipelines.config import Settings
    from pipelines.gateway.fair import FairShare

LOG = logging.getLogger("flywheel.gateway")
IO_TIMEOUT_S = 30.0  # one exchange's file I/O, at most (object storage)
FORGET_S = 3600.0  # a replica's file older than this is removed (a pod rescheduled under a new name)


def turns_uri(settings: Settings, replica: str) -> str:
    return f"{settings.zone('serving')}/gateway/turns/{replica}.json"


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
    for uri in glob(f"{settings.zone('serving')}/gateway/turns/*.json"):
        if uri.rsplit("/", 1)[-1] == f"{replica}.json":
            continue
        try:
            record = check(read_json(uri))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            LOG.warning("turns %s unreadable: %s", uri, exc)
            continue
        age = wall - record["at"]
        if age < record["live_s"]:
            found.append(record)
        elif age > FORGET_S:
            try:
                remove(uri)
            except OSError as exc:
                LOG.warning("turns %s not removed: %s", uri, exc)
    return found


def withdraw(settings: Settings, replica: str) -> None:
    """This replica's file removed (it stops): the others stop counting it at once."""
    from pipelines.storage import exists, remove

    uri = turns_uri(settings, replica)
    try:
        if exists(uri):
            remove(uri)
    except OSError as exc:
        LOG.warning("turns %s not removed: %s (the others stop counting it when it ages out)", uri, exc)


async def keep_in_step(fair: FairShare, settings: Settings, replica: str) -> None:
    """Every `gateway.turns_exchange_s`: this replica's turns out, the others' in (until cancelled). Runs on the
    gateway's loop."""
    every = settings.gateway.turns_exchange_s
    cycle = every
    while True:
        started = time.monotonic()
        state = {**fair.state(), "at": time.time(), "live_s": 3 * max(cycle, every), "replica": replica}
        io = asyncio.ensure_future(asyncio.to_thread(exchange, settings, replica, state))
        try:
            found = await asyncio.wait_for(asyncio.shield(io), IO_TIMEOUT_S)
        except asyncio.CancelledError:  # the gateway stops: a write in flight ends before its file is removed
            await asyncio.wait({io}, timeout=IO_TIMEOUT_S)
            raise
        except asyncio.TimeoutError:
            LOG.warning("the gateway's turns: no exchange within %s s (the others' last known state ages out)",
                        IO_TIMEOUT_S)
        except Exception:  # noqa: BLE001 (the turns go on with what this replica knows)
            LOG.exception("the gateway's turns: exchange failed")
        else:
            fair.learn(found, time.time())
        await asyncio.sleep(every)
        cycle = time.monotonic() - started
