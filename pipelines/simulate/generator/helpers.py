"""Small helpers of the generator's hot path (module level: cheaper than attribute lookups)."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime
from typing import Any

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)


class _Turn:
    """Mutable scratch for one generated turn (kept tiny: this is the hot path)."""

    __slots__ = ("text", "name", "args", "result")

    def __init__(self, text: str, name: str, args: dict[str, Any] | None, result: dict[str, Any]) -> None:
        self.text, self.name, self.args, self.result = text, name, args, result


_SYSTEM_CACHE: dict[tuple[str, date], str] = {}


def _system_prompt(workload: str, day: date) -> str:
    key = (workload, day)
    if key not in _SYSTEM_CACHE:
        _SYSTEM_CACHE[key] = (
            f"You are the {workload.replace('_', ' ')} agent of a commerce assistant. Today is {day.isoformat()}. "
            "Call exactly one of the provided tools with arguments taken from the user's words; "
            "answer in plain text when no tool fits."
        )
    return _SYSTEM_CACHE[key]


def _cumulative(weights: list[float]) -> list[float]:
    total, out = 0.0, []
    s = sum(weights)
    for w in weights:
        total += w / s
        out.append(total)
    out[-1] = 1.0
    return out


def _pick(cumulative: list[float], u: float) -> int:
    for i, c in enumerate(cumulative):
        if u < c:
            return i
    return len(cumulative) - 1


def _id(rng: random.Random, prefix: str) -> str:
    return f"{prefix}-{int(rng.random() * 1e10):010d}"


def _round_price(value: float) -> float:
    return float(round(value)) if value >= 20 else round(value, 2)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _day_end(day: date) -> float:
    return datetime(day.year, day.month, day.day, 23, 59, 59, 999000, tzinfo=UTC).timestamp()


def _maybe_typo(rng: random.Random, text: str) -> str:
    if rng.random() >= 0.08:
        return text
    words = text.split(" ")
    candidates = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha() and w.islower()]
    if not candidates:
        return text
    i = candidates[int(rng.random() * len(candidates))]
    w = words[i]
    j = int(rng.random() * (len(w) - 1))
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :] if rng.random() < 0.7 else w[:j] + w[j + 1 :]
    return " ".join(words)
