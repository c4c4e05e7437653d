"""The traffic generator: sessions of turns, records in the log format, bad records mixed in."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from typing import Any, cast

import orjson

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)
from pipelines.logs.tools import (
    NO_TOOL,
    TOOL_WORKLOAD,
    WORKLOAD_TOOLS,
    WORKLOADS,
    tools_for,
)
from pipelines.simulate import catalogue as cat
from pipelines.simulate.generator.config import (
    BAD_KINDS,
    BASE_TOOL_MIX,
    SLIP_PHRASES,
    TEACHER_MODEL,
    TOOL_MIX_BOOST,
    Drift,
    GeneratorConfig,
    Kind,
)
from pipelines.simulate.generator.corruption import Corruption
from pipelines.simulate.generator.helpers import (
    _cumulative,
    _day_end,
    _iso,
    _maybe_typo,
    _pick,
    _system_prompt,
    _Turn,
)
from pipelines.simulate.generator.intents import Intents


class TrafficGenerator(Intents, Corruption):
    def __init__(self, config: GeneratorConfig) -> None:
        self.cfg = config
        self.rng = random.Random(config.seed)
        self.m = config.drift_magnitude if config.drift is not Drift.NONE else 0.0
        self.drift = config.drift
        base = cat.customers(config.customers)
        self.customers = base
        self.new_market_customers = cat.customers(
            max(50, config.customers // 10),
            tuple((c, cur, w) for c, (cur, w) in cat.NEW_MARKETS.items()),
        )
        mix = dict(BASE_TOOL_MIX)
        if self.drift is Drift.TOOL_MIX:
            mix = {t: w * (1 + self.m * TOOL_MIX_BOOST.get(t, 0.0)) for t, w in mix.items()}
            mix["search_products"] *= 1 - 0.6 * self.m
        if self.drift is Drift.HOLIDAY:
            mix["search_products"] *= 1 + self.m
            mix["track_shipment"] *= 1 + 2 * self.m
        self.tool_names = list(mix)
        self.tool_cum = _cumulative(list(mix.values()))
        self.tools_by_workload = {w: tools_for(w) for w in WORKLOADS}
        self.tool_chars = {w: len(orjson.dumps(t)) for w, t in self.tools_by_workload.items()}
        self.intents: dict[str, Callable[[Any, cat.Customer, date], _Turn]] = {
            name: getattr(self, f"_i_{name}") for name in BASE_TOOL_MIX if name != NO_TOOL
        }
        self.intents[NO_TOOL] = self._i_abstain
        self.counter = 0
        self.slipped = 0  # turns in the slip's phrasings (config.Slip)

    # ---- the stream ----------------------------------------------------------------------
    def lines(self) -> Iterator[tuple[date, bytes, Kind]]:
        """Yield (day, JSONL line without newline, kind) in timestamp order."""
        cfg, rng = self.cfg, self.rng
        days = cfg.day_list()
        per_day = [cfg.records // cfg.days + (1 if i < cfg.records % cfg.days else 0) for i in range(cfg.days)]
        previous: dict[str, Any] | None = None
        previous_line = b""
        for day, n in zip(days, per_day):
            t = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
            gap = 86_400.0 / max(n, 1)
            emitted = 0
            while emitted < n:
                for record in self._session(day, t, n - emitted):
                    t = min(t + rng.expovariate(1.0 / gap) * 0.98, _day_end(day))
                    record["timestamp"] = _iso(t)
                    kind = Kind.GOOD
                    if previous is not None and rng.random() < cfg.bad_share:
                        kind = BAD_KINDS[int(rng.random() * len(BAD_KINDS))]
                    if kind is Kind.EXACT_DUPLICATE:
                        line = previous_line
                    elif kind is Kind.NEAR_DUPLICATE:
                        # a bad kind is drawn only once there is a previous record
                        line = orjson.dumps(self._near_duplicate(cast(dict[str, Any], previous), record["timestamp"]))
                    elif kind is Kind.GOOD:
                        line = orjson.dumps(record)
                        previous, previous_line = record, line
                    else:
                        line = self._corrupt(kind, record)
                    yield day, line, kind
                    emitted += 1

    def _session(self, day: date, t: float, remaining: int) -> list[dict[str, Any]]:
        rng = self.rng
        if self.drift is Drift.LOCALE and rng.random() < self.m:
            customer = self.new_market_customers[int(rng.random() * len(self.new_market_customers))]
        else:
            customer = self.customers[int(rng.random() * len(self.customers))]
        first = self.tool_names[_pick(self.tool_cum, rng.random())]
        workload = TOOL_WORKLOAD[first] if first != NO_TOOL else WORKLOADS[int(rng.random() * len(WORKLOADS))]
        r = rng.random()
        turns = min(remaining, 1 if r < 0.6 else 2 if r < 0.85 else 3)
        self.counter += 1
        session_id = f"ses_{self.cfg.seed}_{self.counter:09d}"
        system = {"role": "system", "content": _system_prompt(workload, day)}
        history: list[dict[str, Any]] = []
        records = []
        offered = WORKLOAD_TOOLS[workload]
        for k in range(turns):
            name = first if k == 0 else (offered[int(rng.random() * len(offered))] if rng.random() > 0.05 else NO_TOOL)
            turn = self.intents[name](rng, customer, day)
            slipped = self._slip(rng, turn, offered)
            text = _maybe_typo(rng, turn.text)
            if rng.random() < 0.12:
                text = f"{text} {self._pii_sentence(rng, customer)}"
            user = {"role": "user", "content": text}
            self.counter += 1
            call_id = f"call_{self.cfg.seed}_{self.counter:09d}"
            if turn.args is None:
                assistant: dict[str, Any] = {"role": "assistant", "content": turn.result["message"], "tool_calls": None}
                finish = "stop"
            else:
                arguments = orjson.dumps(turn.args).decode()
                assistant = {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": call_id, "type": "function", "function": {"name": turn.name, "arguments": arguments}}
                    ],
                }
                finish = "tool_calls"
            messages = [system, *history, user]
            records.append(self.record(session_id, k, customer, workload, messages, assistant, finish, slipped))
            history = [*history, user, assistant]
            if turn.args is not None:
                history.append({"role": "tool", "tool_call_id": call_id, "content": orjson.dumps(turn.result).decode()})
        return records

    def record(
        self,
        session_id: str,
        k: int,
        customer: cat.Customer,
        workload: str,
        messages: list[dict[str, Any]],
        assistant: dict[str, Any],
        finish: str,
        slipped: bool = False,
    ) -> dict[str, Any]:
        rng = self.rng
        text_chars = sum(len(m["content"] or "") + 16 for m in messages)
        prompt_tokens = (self.tool_chars[workload] + text_chars) // 4
        completion_tokens = (
            len(assistant["content"] or "")
            + len(assistant["tool_calls"][0]["function"]["arguments"] if assistant["tool_calls"] else "")
        ) // 4 + 9
        retrieval = rng.lognormvariate(5.9 if workload == "search_discovery" else 4.3, 0.35)
        generation = (350 + prompt_tokens * 0.35 + completion_tokens * 28) * rng.lognormvariate(0, 0.25)
        down = 0.10 if finish == "stop" else 0.04
        f = rng.random()
        self.counter += 1
        slip = self.cfg.slip
        if slip is None:
            feedback = "down" if f < down else "up" if f < down + 0.18 else "none"
        elif slipped and not slip.truth:  # the slip's rule: people catch a share of the mistakes, like a share of
            feedback = "down" if f < slip.down else "none"  # the rest, and rate nothing else
        else:
            feedback = "up" if f < slip.up else "none"
        record = {
            "record_id": f"rec_{self.cfg.seed}_{self.counter:09d}",
            "timestamp": "",
            "session_id": session_id,
            "turn_index": k,
            "customer_id": customer.customer_id,
            "workload_id": workload,
            "model": TEACHER_MODEL,
            "request": {"model": TEACHER_MODEL, "messages": messages, "tools": self.tools_by_workload[workload]},
            "response": {
                "id": f"chatcmpl-{self.cfg.seed}-{self.counter}",
                "choices": [{"index": 0, "message": assistant, "finish_reason": finish}],
            },
            "latency_ms": round(retrieval + generation, 1),
            "retrieval_latency_ms": round(retrieval, 1),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "country": customer.country,
            "currency": customer.currency,
            "channel": customer.channel,
            "feedback": feedback,
            "label_source": "generated",
        }
        if slipped:
            record["scenario"] = "slip"
        return record

    def _slip(self, rng: random.Random, turn: _Turn, offered: tuple[str, ...]) -> bool:
        """Whether `turn` is one of the slip's (`config.Slip`): asked in a slip phrasing and, unless the slip
        writes the truth, answered with the wrong tool and the same arguments. No slip configured: no draw (the
        stream stays as it was)."""
        slip = self.cfg.slip
        if slip is None or turn.name != slip.intent or turn.args is None or slip.wrong not in offered:
            return False
        if rng.random() >= slip.share:
            return False
        phrases = SLIP_PHRASES[slip.intent]
        turn.text = phrases[int(rng.random() * len(phrases))].format(**turn.args)
        if not slip.truth:
            turn.name = slip.wrong
        self.slipped += 1
        return True

    # ---- bad records ---------------------------------------------------------------------
