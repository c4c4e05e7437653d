"""Synthetic commerce-agent traffic: the platform's demo and test data.

Deterministic for a seed (same arguments -> byte-identical files). Realistic enough to exercise
every later stage: many phrasings per intent, typos, multi-turn sessions, PII in free text and in
tool arguments, a configurable share of bad records of every kind prep must quarantine or dedupe,
and drift scenarios the monitor must catch.
"""

from __future__ import annotations

import gzip
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timedelta, timezone
from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

from pipelines.logs import catalogue as cat
from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)
from pipelines.logs.schema import Reason
from pipelines.logs.tools import (
    CARRIERS, DISPUTE_STATUSES, INVOICE_STATUSES, SIZES, TOOL_WORKLOAD, WORKLOAD_TOOLS, WORKLOADS, tools_for,
)

TEACHER_MODEL = "llama-3.3-70b-instruct"


class Drift(StrEnum):
    NONE = "none"
    HOLIDAY = "holiday"
    NEW_CATEGORY = "new-category"
    LOCALE = "locale"
    TOOL_MIX = "tool-mix"


class Kind(StrEnum):
    """What the generator meant a line to be; tests compare it with what validation says."""

    GOOD = "good"
    BAD_JSON = "bad_json"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_TOOL = "unknown_tool"
    INVALID_ARGUMENTS = "invalid_arguments"
    IMPOSSIBLE_LATENCY = "impossible_latency"
    EXACT_DUPLICATE = "exact_duplicate"
    NEAR_DUPLICATE = "near_duplicate"


# The quarantine reason each bad kind must get (duplicates are valid lines: dedupe removes them).
EXPECTED_REASON: dict[Kind, Reason | None] = {
    Kind.GOOD: None,
    Kind.BAD_JSON: Reason.BAD_JSON,
    Kind.MISSING_FIELD: Reason.SCHEMA_VIOLATION,
    Kind.WRONG_TYPE: Reason.SCHEMA_VIOLATION,
    Kind.UNKNOWN_TOOL: Reason.UNKNOWN_TOOL,
    Kind.INVALID_ARGUMENTS: Reason.INVALID_ARGUMENTS,
    Kind.IMPOSSIBLE_LATENCY: Reason.IMPOSSIBLE_VALUE,
    Kind.EXACT_DUPLICATE: None,
    Kind.NEAR_DUPLICATE: None,
}
BAD_KINDS = tuple(k for k in Kind if k is not Kind.GOOD)

ABSTAIN = "<abstain>"
BASE_TOOL_MIX: dict[str, float] = {
    "search_products": 0.30, "get_product": 0.07, "create_order": 0.07, "get_order": 0.08,
    "capture_order": 0.03, "create_invoice": 0.05, "send_invoice": 0.03, "list_invoices": 0.03,
    "track_shipment": 0.10, "search_transactions": 0.06, "create_subscription": 0.03,
    "cancel_subscription": 0.03, "get_subscription": 0.03, "list_disputes": 0.03, "get_dispute": 0.03,
    ABSTAIN: 0.03,
}
TOOL_MIX_BOOST = {"list_disputes": 6.0, "get_dispute": 6.0, "create_subscription": 4.0, "cancel_subscription": 4.0,
                  "get_subscription": 4.0, "search_transactions": 3.0}
HOLIDAY_CATEGORIES = ("toys", "jewelry", "electronics", "home", "beauty")


@dataclass(frozen=True)
class GeneratorConfig:
    seed: int = 0
    records: int = 10_000
    days: int = 1
    end_date: date = field(default_factory=lambda: datetime.now(timezone.utc).date())
    bad_share: float = 0.05
    drift: Drift = Drift.NONE
    drift_magnitude: float = 0.6
    customers: int = 5000

    def __post_init__(self) -> None:
        if self.records < 0:
            raise ValueError("records must be >= 0")
        if self.days < 1:
            raise ValueError("days must be >= 1")
        if not 0.0 <= self.bad_share <= 1.0:
            raise ValueError("bad_share must be within [0, 1]")
        if not 0.0 <= self.drift_magnitude <= 1.0:
            raise ValueError("drift_magnitude must be within [0, 1]")
        if self.customers < 1:
            raise ValueError("customers must be >= 1")

    def day_list(self) -> list[date]:
        return [self.end_date - timedelta(days=self.days - 1 - i) for i in range(self.days)]


@dataclass
class GenerationSummary:
    seed: int
    records: int
    drift: str
    drift_magnitude: float
    bad_share: float
    kinds: dict[str, int]
    tools: dict[str, int]
    days: dict[str, int]
    files: list[str]
    seconds: float
    records_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Turn:
    """Mutable scratch for one generated turn (kept tiny: this is the hot path)."""

    __slots__ = ("text", "name", "args", "result")

    def __init__(self, text: str, name: str, args: dict[str, Any] | None, result: dict[str, Any]) -> None:
        self.text, self.name, self.args, self.result = text, name, args, result


class TrafficGenerator:
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
            name: getattr(self, f"_i_{name}") for name in BASE_TOOL_MIX if name != ABSTAIN
        }
        self.intents[ABSTAIN] = self._i_abstain
        self.counter = 0

    # ---- the stream ----------------------------------------------------------------------
    def lines(self) -> Iterator[tuple[date, bytes, Kind]]:
        """Yield (day, JSONL line without newline, kind) in timestamp order."""
        cfg, rng = self.cfg, self.rng
        days = cfg.day_list()
        per_day = [cfg.records // cfg.days + (1 if i < cfg.records % cfg.days else 0) for i in range(cfg.days)]
        previous: dict[str, Any] | None = None
        previous_line = b""
        for day, n in zip(days, per_day):
            t = datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp()
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
                        line = orjson.dumps(self._near_duplicate(previous, record["timestamp"]))
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
        workload = TOOL_WORKLOAD[first] if first != ABSTAIN else WORKLOADS[int(rng.random() * len(WORKLOADS))]
        r = rng.random()
        turns = min(remaining, 1 if r < 0.6 else 2 if r < 0.85 else 3)
        self.counter += 1
        session_id = f"ses_{self.cfg.seed}_{self.counter:09d}"
        system = {"role": "system", "content": _system_prompt(workload, day)}
        history: list[dict[str, Any]] = []
        records = []
        offered = WORKLOAD_TOOLS[workload]
        for k in range(turns):
            name = first if k == 0 else (offered[int(rng.random() * len(offered))] if rng.random() > 0.05 else ABSTAIN)
            turn = self.intents[name](rng, customer, day)
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
                assistant = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": turn.name, "arguments": arguments}}]}
                finish = "tool_calls"
            messages = [system, *history, user]
            records.append(self.record(session_id, k, customer, workload, messages, assistant, finish))
            history = [*history, user, assistant]
            if turn.args is not None:
                history.append({"role": "tool", "tool_call_id": call_id,
                                "content": orjson.dumps(turn.result).decode()})
        return records

    def record(self, session_id: str, k: int, customer: cat.Customer, workload: str,
                messages: list[dict[str, Any]], assistant: dict[str, Any], finish: str) -> dict[str, Any]:
        rng = self.rng
        text_chars = sum(len(m["content"] or "") + 16 for m in messages)
        prompt_tokens = (self.tool_chars[workload] + text_chars) // 4
        completion_tokens = (len(assistant["content"] or "") + len(
            assistant["tool_calls"][0]["function"]["arguments"] if assistant["tool_calls"] else "")) // 4 + 9
        retrieval = rng.lognormvariate(5.9 if workload == "search_discovery" else 4.3, 0.35)
        generation = (350 + prompt_tokens * 0.35 + completion_tokens * 28) * rng.lognormvariate(0, 0.25)
        down = 0.10 if finish == "stop" else 0.04
        f = rng.random()
        self.counter += 1
        return {
            "record_id": f"rec_{self.cfg.seed}_{self.counter:09d}",
            "timestamp": "",
            "session_id": session_id,
            "turn_index": k,
            "customer_id": customer.customer_id,
            "workload_id": workload,
            "model": TEACHER_MODEL,
            "request": {"model": TEACHER_MODEL, "messages": messages, "tools": self.tools_by_workload[workload]},
            "response": {"id": f"chatcmpl-{self.cfg.seed}-{self.counter}", "choices": [
                {"index": 0, "message": assistant, "finish_reason": finish}]},
            "latency_ms": round(retrieval + generation, 1),
            "retrieval_latency_ms": round(retrieval, 1),
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "country": customer.country,
            "currency": customer.currency,
            "channel": customer.channel,
            "feedback": "down" if f < down else "up" if f < down + 0.18 else "none",
        }

    # ---- bad records ---------------------------------------------------------------------
    def _corrupt(self, kind: Kind, record: dict[str, Any]) -> bytes:
        rng = self.rng
        record = orjson.loads(orjson.dumps(record))  # messages are shared with later turns' history
        if kind is Kind.BAD_JSON:
            line = orjson.dumps(record)
            return line[: max(1, int(len(line) * (0.2 + 0.7 * rng.random())))]
        if kind is Kind.MISSING_FIELD:
            del record[rng.choice(("customer_id", "timestamp", "session_id", "workload_id", "response", "request"))]
        elif kind is Kind.WRONG_TYPE:
            field_name, value = rng.choice((("latency_ms", "fast"), ("prompt_tokens", "many"),
                                            ("turn_index", [1]), ("feedback", 5), ("country", "United States")))
            record[field_name] = value
        elif kind is Kind.UNKNOWN_TOOL:
            message = record["response"]["choices"][0]["message"]
            message["content"] = None
            message["tool_calls"] = [{"id": "call_x", "type": "function", "function": {
                "name": rng.choice(("refund_everything", "search_product", "delete_account", "get_weather")),
                "arguments": "{}"}}]
        elif kind is Kind.INVALID_ARGUMENTS:
            message = record["response"]["choices"][0]["message"]
            calls = message.get("tool_calls")
            if not calls:  # an abstention: give it a call whose arguments break the schema
                name = record["request"]["tools"][0]["function"]["name"]
                calls = message["tool_calls"] = [{"id": "call_y", "type": "function",
                                                  "function": {"name": name, "arguments": "{}"}}]
            fn = calls[0]["function"]
            if rng.random() < 0.5:
                fn["arguments"] = orjson.dumps({**orjson.loads(fn["arguments"]), "debug_mode": True}).decode()
            else:
                fn["arguments"] = fn["arguments"].replace('"', "'") + "}" if fn["arguments"] != "{}" else "{'a':"
        elif kind is Kind.IMPOSSIBLE_LATENCY:
            choice = rng.random()
            if choice < 0.4:
                record["latency_ms"] = -record["latency_ms"]
            elif choice < 0.7:
                record["latency_ms"] = 3_600_000.0 + record["latency_ms"]
            else:
                record["retrieval_latency_ms"] = record["latency_ms"] * 3 + 1
        return orjson.dumps(record)

    def _near_duplicate(self, previous: dict[str, Any], timestamp: str) -> dict[str, Any]:
        rng = self.rng
        twin = orjson.loads(orjson.dumps(previous))
        user = twin["request"]["messages"][-1]
        text = user["content"]
        user["content"] = rng.choice((text.upper(), f"  {text}  ", text.replace(" ", "  "), text.lower() + "!"))
        self.counter += 1
        twin["record_id"] = f"rec_{self.cfg.seed}_{self.counter:09d}"
        twin["timestamp"] = timestamp
        return twin

    # ---- PII -----------------------------------------------------------------------------
    @staticmethod
    def _email(rng: random.Random, customer: cat.Customer) -> str:
        local = f"{customer.first_name}.{customer.last_name}".lower().replace("ü", "u").replace("'", "")
        return f"{local}{int(rng.random() * 100)}@{rng.choice(('gmail.com', 'outlook.com', 'example.org', 'shop.co'))}"

    @staticmethod
    def _address(rng: random.Random) -> str:
        return f"{int(rng.random() * 9000) + 10} {rng.choice(cat.STREETS)}, {rng.choice(cat.CITIES)}"

    def _pii_sentence(self, rng: random.Random, customer: cat.Customer) -> str:
        which = rng.random()
        if which < 0.3:
            return rng.choice(("My email is {}.", "Reach me at {}", "send the receipt to {} please")).format(
                self._email(rng, customer))
        if which < 0.55:
            number = f"{int(rng.random() * 900) + 100}-555-{int(rng.random() * 9000) + 1000:04d}"
            phone = rng.choice((f"+1 {number}", f"({number[:3]}) {number[4:]}", f"+44 20 7946 {number[-4:]}"))
            return rng.choice(("Call me on {}.", "my phone is {}", "text {} when it ships")).format(phone)
        if which < 0.8:
            digits = luhn_complete("4" + "".join(str(int(rng.random() * 10)) for _ in range(14)))
            sep = rng.choice((" ", "-", ""))
            card = sep.join(digits[i:i + 4] for i in range(0, 16, 4))
            return rng.choice(("I paid with card {}.", "charged to my card {} twice", "card number {}")).format(card)
        return rng.choice(("I live at {}.", "ship it to {}", "my address is {}")).format(self._address(rng))

    # ---- intents: each returns the user's words and the tool call they should produce ----
    def _product(self, rng: random.Random) -> cat.Product:
        by_cat = cat.products_by_category()
        if self.drift is Drift.NEW_CATEGORY and rng.random() < 0.6 * self.m:
            category = rng.choice(cat.NEW_CATEGORIES)
        elif self.drift is Drift.HOLIDAY and rng.random() < self.m:
            category = rng.choice(HOLIDAY_CATEGORIES)
        else:
            category = cat.BASELINE_CATEGORIES[int(rng.random() * len(cat.BASELINE_CATEGORIES))]
        items = by_cat[category]
        return items[int(rng.random() * len(items))]

    def _i_search_products(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        p = self._product(rng)
        args: dict[str, Any] = {"query": p.noun, "category": p.category}
        price = _round_price(p.price_usd * cat.FX_PER_USD[customer.currency] * (1.2 + rng.random()))
        cur = customer.currency
        if self.drift is Drift.HOLIDAY and rng.random() < self.m:
            who = rng.choice(("my dad", "my mom", "my sister", "a coworker", "my boyfriend", "my niece", "grandma"))
            text = rng.choice((
                f"christmas gift ideas for {who}, maybe a {p.noun} under {price:g} {cur}",
                f"need a {p.noun} as a holiday present for {who}, max {price:g} {cur}",
                f"secret santa gift: {p.noun} under {price:g} {cur}",
                f"stocking stuffer {p.noun} below {price:g} {cur} that arrives before december 24",
            ))
            return _Turn(text, "search_products", {**args, "max_price": price, "currency": cur}, {"results": 12})
        if self.drift is Drift.LOCALE and customer.country in cat.NEW_MARKETS and rng.random() < 0.5 * self.m:
            text = rng.choice((f"busco {p.noun} de {p.brand}", f"quero comprar {p.noun} {p.brand}",
                               f"{p.brand} no {p.noun} o sagashite imasu"))
            return _Turn(text, "search_products", {**args, "brand": p.brand}, {"results": 7})
        variant = int(rng.random() * 8)
        if variant == 0:
            text = rng.choice((f"show me {p.noun}s", f"looking for a {p.noun}", f"do you sell {p.noun}s?",
                               f"{p.noun}", f"I need a new {p.noun}"))
        elif variant == 1:
            text = rng.choice((f"{p.brand} {p.noun}", f"any {p.noun} from {p.brand}?",
                               f"find me a {p.brand} {p.noun}"))
            args["brand"] = p.brand
        elif variant == 2:
            text = rng.choice((f"{p.color} {p.noun} under {price:g} {cur}", f"a {p.color} {p.noun}, max {price:g} {cur}",
                               f"cheap {p.color} {p.noun} less than {price:g} {cur}"))
            args.update(color=p.color, max_price=price, currency=cur)
        elif variant == 3:
            low = _round_price(price / 3)
            text = rng.choice((f"{p.noun} between {low:g} and {price:g} {cur}",
                               f"{p.noun}s priced {low:g}-{price:g} {cur}"))
            args.update(min_price=low, max_price=price, currency=cur)
        elif variant == 4 and p.sized:
            size = rng.choice(SIZES[:6] if p.category == "apparel" else SIZES[6:])
            text = rng.choice((f"{p.noun} in size {size}", f"{p.color} {p.noun} size {size}",
                               f"do you have the {p.brand} {p.noun} in {size}?"))
            args["size"] = size
            if p.color in text:
                args["color"] = p.color
            if p.brand in text:
                args["brand"] = p.brand
        elif variant == 5:
            limit = rng.choice((3, 5, 10))
            text = rng.choice((f"top {limit} {p.noun}s", f"show {limit} options for {p.noun}"))
            args["limit"] = limit
        elif variant == 6:
            text = rng.choice((f"{p.color} {p.noun}", f"looking for {p.color} {p.noun}s"))
            args["color"] = p.color
        else:
            text = rng.choice((f"{p.brand} {p.noun} under {price:g} {cur}", f"{p.noun} by {p.brand} max {price:g} {cur}"))
            args.update(brand=p.brand, max_price=price, currency=cur)
        return _Turn(text, "search_products", args, {"results": int(rng.random() * 40)})

    def _i_get_product(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        p = self._product(rng)
        text = rng.choice((f"tell me more about {p.product_id}", f"is {p.product_id} in stock?",
                           f"details for item {p.product_id} please", f"what colors does {p.product_id} come in",
                           f"specs of {p.product_id}"))
        return _Turn(text, "get_product", {"product_id": p.product_id}, {"product_id": p.product_id, "in_stock": True})

    def _i_create_order(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        p = self._product(rng)
        qty = rng.choice((1, 1, 1, 2, 3, 4))
        args: dict[str, Any] = {"items": [{"product_id": p.product_id, "quantity": qty}], "currency": customer.currency}
        if rng.random() < 0.4:
            address = self._address(rng)
            text = rng.choice((f"order {qty} of {p.product_id} and ship to {address}",
                               f"buy {p.product_id} x{qty}, deliver to {address}"))
            args["shipping_address"] = address
        else:
            text = rng.choice((f"buy {qty} of {p.product_id}", f"I'll take {qty} x {p.product_id}",
                               f"place an order for {p.product_id}, quantity {qty}",
                               f"add {qty} {p.product_id} to an order and check out"))
        return _Turn(text, "create_order", args, {"order_id": _id(rng, "ORD"), "status": "CREATED"})

    def _i_get_order(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        oid = _id(rng, "ORD")
        text = rng.choice((f"where is my order {oid}", f"status of order {oid}?", f"has {oid} been paid?",
                           f"what's going on with {oid}", f"check order {oid} for me"))
        return _Turn(text, "get_order", {"order_id": oid}, {"order_id": oid, "status": rng.choice(("APPROVED", "COMPLETED"))})

    def _i_capture_order(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        oid = _id(rng, "ORD")
        if rng.random() < 0.5:
            amount = _round_price(20 + rng.random() * 480)
            text = rng.choice((f"capture {amount:g} {customer.currency} on order {oid}",
                               f"charge {amount:g} {customer.currency} for {oid} now"))
            args = {"order_id": oid, "amount": amount, "currency": customer.currency}
        else:
            text = rng.choice((f"capture payment for order {oid}", f"capture {oid}", f"finalize the payment on {oid}"))
            args = {"order_id": oid}
        return _Turn(text, "capture_order", args, {"status": "COMPLETED"})

    def _i_create_invoice(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        client = rng.choice(cat.customers(5000)[:400])
        email = self._email(rng, client)
        amount = _round_price(30 + rng.lognormvariate(5, 0.8))
        what = rng.choice(("web design work", "consulting hours", "catering for the event", "october retainer",
                           "photography session", "custom furniture"))
        args: dict[str, Any] = {"recipient_email": email, "amount": amount, "currency": customer.currency}
        if rng.random() < 0.5:
            due = (day + timedelta(days=rng.choice((7, 14, 30)))).isoformat()
            text = rng.choice((f"invoice {email} {amount:g} {customer.currency} for {what}, due {due}",
                               f"bill {email} for {what}: {amount:g} {customer.currency}, payment due {due}"))
            args.update(description=what, due_date=due)
        else:
            text = rng.choice((f"create an invoice for {email} of {amount:g} {customer.currency}",
                               f"new invoice to {email}, {amount:g} {customer.currency}"))
        return _Turn(text, "create_invoice", args, {"invoice_id": _id(rng, "INV"), "status": "DRAFT"})

    def _i_send_invoice(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        iid = _id(rng, "INV")
        if rng.random() < 0.3:
            note = rng.choice(("Thanks for your business!", "Happy holidays", "Payment within 14 days please"))
            text = f"send invoice {iid} with the note: {note}"
            args = {"invoice_id": iid, "note": note}
        else:
            text = rng.choice((f"send invoice {iid}", f"email {iid} to the client", f"go ahead and send {iid}"))
            args = {"invoice_id": iid}
        return _Turn(text, "send_invoice", args, {"status": "SENT"})

    def _i_list_invoices(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        status = rng.choice(INVOICE_STATUSES)
        if rng.random() < 0.5:
            text = rng.choice((f"show my {status.lower()} invoices", f"list {status.lower()} invoices",
                               f"which invoices are {status.lower()}?"))
            args: dict[str, Any] = {"status": status}
        else:
            start = day - timedelta(days=rng.choice((7, 30, 90)))
            text = rng.choice((f"list invoices from {start.isoformat()} to {day.isoformat()}",
                               f"invoices between {start.isoformat()} and {day.isoformat()}"))
            args = {"start_date": start.isoformat(), "end_date": day.isoformat()}
        return _Turn(text, "list_invoices", args, {"count": int(rng.random() * 20)})

    def _i_track_shipment(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        if self.drift is Drift.LOCALE and customer.country in cat.NEW_MARKETS and rng.random() < 0.5 * self.m:
            oid = _id(rng, "ORD")
            text = rng.choice((f"dónde está mi pedido {oid}", f"onde está meu pedido {oid}?"))
            return _Turn(text, "track_shipment", {"order_id": oid}, {"status": "IN_TRANSIT"})
        if rng.random() < 0.5:
            carrier = rng.choice(CARRIERS)
            tracking = "1Z" + "".join(rng.choice("0123456789ABCDEF") for _ in range(14))
            text = rng.choice((f"track {tracking} ({carrier})", f"where is package {tracking} with {carrier}",
                               f"{carrier} tracking {tracking}"))
            args: dict[str, Any] = {"tracking_number": tracking, "carrier": carrier}
        else:
            oid = _id(rng, "ORD")
            text = rng.choice((f"where's the package for order {oid}", f"when will {oid} arrive?",
                               f"track my shipment for {oid}", f"has {oid} shipped yet"))
            args = {"order_id": oid}
        return _Turn(text, "track_shipment", args, {"status": rng.choice(("IN_TRANSIT", "DELIVERED"))})

    def _i_search_transactions(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        start = day - timedelta(days=rng.choice((1, 7, 14, 30, 60)))
        s, e = start.isoformat(), day.isoformat()
        args: dict[str, Any] = {"start_date": s, "end_date": e}
        r = rng.random()
        if r < 0.35:
            amount = _round_price(50 + rng.random() * 950)
            text = rng.choice((f"payments over {amount:g} {customer.currency} from {s} to {e}",
                               f"transactions above {amount:g} {customer.currency} between {s} and {e}"))
            args.update(min_amount=amount, currency=customer.currency)
        elif r < 0.6:
            status = rng.choice(("REFUNDED", "DENIED", "PENDING"))
            text = rng.choice((f"{status.lower()} transactions since {s}", f"show {status.lower()} payments {s} to {e}"))
            args["status"] = status
        else:
            text = rng.choice((f"show transactions from {s} to {e}", f"all payments between {s} and {e}",
                               f"transaction history {s} - {e}"))
        return _Turn(text, "search_transactions", args, {"count": int(rng.random() * 200)})

    def _i_create_subscription(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        plan = rng.choice(("P-BASIC-MONTHLY", "P-PRO-MONTHLY", "P-PRO-ANNUAL", "P-TEAM-ANNUAL", "P-COFFEE-CLUB"))
        if rng.random() < 0.4:
            qty = rng.choice((2, 5, 10, 25))
            start = (day + timedelta(days=rng.choice((1, 7, 14)))).isoformat()
            text = rng.choice((f"subscribe us to {plan} for {qty} seats starting {start}",
                               f"start {plan} on {start} with {qty} seats"))
            args: dict[str, Any] = {"plan_id": plan, "start_date": start, "quantity": qty}
        else:
            text = rng.choice((f"subscribe me to plan {plan}", f"sign me up for {plan}", f"I want the {plan} plan"))
            args = {"plan_id": plan}
        return _Turn(text, "create_subscription", args, {"subscription_id": _id(rng, "I")})

    def _i_cancel_subscription(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        sid = _id(rng, "I")
        reason = rng.choice(("too expensive", "not using it anymore", "switching to another provider",
                             "moving abroad", "the service was unreliable"))
        text = rng.choice((f"cancel subscription {sid} because it's {reason}", f"please cancel {sid}, {reason}",
                           f"stop {sid}: {reason}"))
        return _Turn(text, "cancel_subscription", {"subscription_id": sid, "reason": reason}, {"status": "CANCELLED"})

    def _i_get_subscription(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        sid = _id(rng, "I")
        text = rng.choice((f"when is the next billing for {sid}?", f"status of subscription {sid}",
                           f"is {sid} still active?"))
        return _Turn(text, "get_subscription", {"subscription_id": sid}, {"status": "ACTIVE"})

    def _i_list_disputes(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        status = rng.choice(DISPUTE_STATUSES)
        if rng.random() < 0.5:
            words = status.lower().replace("_", " ")
            text = rng.choice((f"show disputes that are {words}", f"list {words} disputes"))
            args: dict[str, Any] = {"status": status}
        else:
            since = (day - timedelta(days=rng.choice((7, 30)))).isoformat()
            text = rng.choice((f"any disputes since {since}?", f"list disputes opened after {since}"))
            args = {"start_date": since}
        return _Turn(text, "list_disputes", args, {"count": int(rng.random() * 8)})

    def _i_get_dispute(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        did = _id(rng, "PP-D")
        text = rng.choice((f"what's happening with dispute {did}?", f"details of {did}",
                           f"when do I need to respond to {did}"))
        return _Turn(text, "get_dispute", {"dispute_id": did}, {"status": "UNDER_REVIEW"})

    def _i_abstain(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        text, answer = rng.choice((
            ("thanks, that's all", "You're welcome! Anything else I can help with?"),
            ("what's your return policy?", "Items can be returned within 30 days of delivery."),
            ("tell me a joke", "I can help with shopping, orders, invoices and payments."),
            ("what's the weather tomorrow?", "I can't check the weather, but I can track your orders."),
            ("hi", "Hi! How can I help with your shopping or payments today?"),
            ("can I talk to a human?", "I'll connect you with a support agent."),
        ))
        return _Turn(text, ABSTAIN, None, {"message": answer})


# ---- small helpers (module level: cheaper than attribute lookups) -------------------------
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
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _day_end(day: date) -> float:
    return datetime(day.year, day.month, day.day, 23, 59, 59, 999000, tzinfo=timezone.utc).timestamp()


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
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:] if rng.random() < 0.7 else w[:j] + w[j + 1:]
    return " ".join(words)


def partition_dir(raw_root: Path, day: date) -> Path:
    return raw_root / f"dt={day.isoformat()}"


def write_raw_logs(config: GeneratorConfig, raw_root: Path, *, compress: bool = False,
                   progress: Callable[[int], None] | None = None) -> GenerationSummary:
    """Generate traffic and write one JSONL file per date partition under `raw_root`.

    The file name carries the seed, so re-running the same generation replaces its own files
    (idempotent) and never touches other sources' files in the partition. Writes are atomic.
    """
    started = time.perf_counter()
    gen = TrafficGenerator(config)
    kinds: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    days: Counter[str] = Counter()
    files: list[str] = []
    suffix = ".jsonl.gz" if compress else ".jsonl"
    current: date | None = None
    handle: Any = None
    tmp_path = final_path = None
    buffer: list[bytes] = []

    def close() -> None:
        if handle is not None:
            handle.write(b"".join(buffer))
            buffer.clear()
            handle.close()
            os.replace(tmp_path, final_path)

    # Empty days still get an (empty) file, so "no traffic" is distinguishable from "not ingested".
    for day in config.day_list():
        partition_dir(raw_root, day).mkdir(parents=True, exist_ok=True)
    try:
        for n, (day, line, kind) in enumerate(gen.lines(), 1):
            if day != current:
                close()
                current = day
                final_path = partition_dir(raw_root, day) / f"generated-seed{config.seed}{suffix}"
                tmp_path = final_path.with_name(f".{final_path.name}.tmp")
                handle = gzip.GzipFile(tmp_path, "wb", compresslevel=5, mtime=0) if compress else open(tmp_path, "wb")
                files.append(str(final_path))
            buffer.append(line)
            buffer.append(b"\n")
            if len(buffer) >= 4096:
                handle.write(b"".join(buffer))
                buffer.clear()
            kinds[kind.value] += 1
            days[day.isoformat()] += 1
            if kind is Kind.GOOD:
                tools[_tool_of(line)] += 1
            if progress is not None and n % 1000 == 0:
                progress(1000)
        close()
        handle = None
    finally:
        if handle is not None:
            handle.close()
    for day in config.day_list():
        path = partition_dir(raw_root, day) / f"generated-seed{config.seed}{suffix}"
        if not path.exists():
            _write_empty(path, compress)
            files.append(str(path))
    elapsed = time.perf_counter() - started
    return GenerationSummary(
        seed=config.seed, records=sum(kinds.values()), drift=config.drift.value,
        drift_magnitude=config.drift_magnitude if config.drift is not Drift.NONE else 0.0,
        bad_share=config.bad_share, kinds=dict(sorted(kinds.items())), tools=dict(sorted(tools.items())),
        days=dict(sorted(days.items())), files=sorted(files), seconds=round(elapsed, 3),
        records_per_s=round(sum(kinds.values()) / elapsed, 1) if elapsed > 0 else 0.0,
    )


def _write_empty(path: Path, compress: bool) -> None:
    if compress:
        with gzip.GzipFile(path, "wb", mtime=0):
            pass
    else:
        path.write_bytes(b"")


_TOOL_MARK = b'"tool_calls":[{"id":"'


def _tool_of(line: bytes) -> str:
    """Tool name of a good line without re-parsing it (the last tool call is the response's)."""
    i = line.rfind(_TOOL_MARK)
    j = line.rfind(b'"finish_reason":"')
    if i < 0 or line[j + 17:j + 21] == b"stop":
        return ABSTAIN
    k = line.find(b'"name":"', i) + 8
    return line[k:line.find(b'"', k)].decode()
