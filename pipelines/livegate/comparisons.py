"""The live comparisons a gateway recorded (`<serving zone>/gateway/agreement/dt=<day>/`, one JSON line per
compared request, written by `gateway.traffic`), read back: all of them from a time on, or one route's tally
since it entered its mode (what the live gate decides on)."""

from __future__ import annotations

from typing import Any

import orjson

from pipelines.config import Settings
from pipelines.livegate import routes as rt


def agreement_zone(settings: Settings) -> str:
    return f"{settings.zone('serving')}/gateway/agreement"


def read_comparisons(settings: Settings, since: str | None = None) -> list[dict[str, Any]]:
    """Every recorded comparison (from `since`, an ISO time, on), oldest first."""
    from pipelines.storage import glob, read_bytes

    day = since[:10] if since else ""
    out = []
    for uri in sorted(glob(f"{agreement_zone(settings)}/dt=*/gateway-*.jsonl")):
        if uri.rsplit("/", 2)[-2][3:] < day:
            continue
        for line in read_bytes(uri).splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a torn last line of a killed gateway
            if since is None or record["timestamp"] >= since:
                out.append(record)
    return sorted(out, key=lambda r: r["timestamp"])


def tally_of(settings: Settings, model: str, route: dict[str, Any]) -> rt.Tally:
    """A route's comparisons since it entered its current mode (from the recorded files)."""
    tally = rt.Tally(route.get("since", ""))
    for r in read_comparisons(settings, route.get("since")):
        if r["route"] == model and r["mode"] == route["mode"] and r["arm"] == "candidate" and not r["skipped"]:
            tally.add(r["agreement"], r["error"] is not None)
    return tally
