"""The user's words and the tool call they should produce, one builder per intent, with PII in
free text and arguments."""

from __future__ import annotations

import random
from datetime import date, timedelta
from typing import Any

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)
from pipelines.logs.tools import (
    CARRIERS,
    DISPUTE_STATUSES,
    INVOICE_STATUSES,
    NO_TOOL,
    SIZES,
)
from pipelines.simulate import catalogue as cat
from pipelines.simulate.generator.config import HOLIDAY_CATEGORIES, Drift
from pipelines.simulate.generator.helpers import _id, _round_price, _Turn


class Intents:
    """Mixin of `TrafficGenerator`: its `drift`, `m` (drift magnitude) and catalogue state."""

    drift: Drift
    m: float

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
                self._email(rng, customer)
            )
        if which < 0.55:
            number = f"{int(rng.random() * 900) + 100}-555-{int(rng.random() * 9000) + 1000:04d}"
            phone = rng.choice((f"+1 {number}", f"({number[:3]}) {number[4:]}", f"+44 20 7946 {number[-4:]}"))
            return rng.choice(("Call me on {}.", "my phone is {}", "text {} when it ships")).format(phone)
        if which < 0.8:
            digits = luhn_complete("4" + "".join(str(int(rng.random() * 10)) for _ in range(14)))
            sep = rng.choice((" ", "-", ""))
            card = sep.join(digits[i : i + 4] for i in range(0, 16, 4))
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
            text = rng.choice(
                (
                    f"christmas gift ideas for {who}, maybe a {p.noun} under {price:g} {cur}",
                    f"need a {p.noun} as a holiday present for {who}, max {price:g} {cur}",
                    f"secret santa gift: {p.noun} under {price:g} {cur}",
                    f"stocking stuffer {p.noun} below {price:g} {cur} that arrives before december 24",
                )
            )
            return _Turn(text, "search_products", {**args, "max_price": price, "currency": cur}, {"results": 12})
        if self.drift is Drift.LOCALE and customer.country in cat.NEW_MARKETS and rng.random() < 0.5 * self.m:
            text = rng.choice(
                (
                    f"busco {p.noun} de {p.brand}",
                    f"quero comprar {p.noun} {p.brand}",
                    f"{p.brand} no {p.noun} o sagashite imasu",
                )
            )
            return _Turn(text, "search_products", {**args, "brand": p.brand}, {"results": 7})
        text = self._plain_search(rng, p, args, price, cur)
        return _Turn(text, "search_products", args, {"results": int(rng.random() * 40)})

    @staticmethod
    def _plain_search(rng: random.Random, p: cat.Product, args: dict[str, Any], price: float, cur: str) -> str:
        """One of the plain (undrifted) search phrasings: its text; the arguments it names are added to `args`."""
        variant = int(rng.random() * 8)
        if variant == 0:
            text = rng.choice(
                (
                    f"show me {p.noun}s",
                    f"looking for a {p.noun}",
                    f"do you sell {p.noun}s?",
                    f"{p.noun}",
                    f"I need a new {p.noun}",
                )
            )
        elif variant == 1:
            text = rng.choice((f"{p.brand} {p.noun}", f"any {p.noun} from {p.brand}?", f"find me a {p.brand} {p.noun}"))
            args["brand"] = p.brand
        elif variant == 2:
            text = rng.choice(
                (
                    f"{p.color} {p.noun} under {price:g} {cur}",
                    f"a {p.color} {p.noun}, max {price:g} {cur}",
                    f"cheap {p.color} {p.noun} less than {price:g} {cur}",
                )
            )
            args.update(color=p.color, max_price=price, currency=cur)
        elif variant == 3:
            low = _round_price(price / 3)
            text = rng.choice(
                (f"{p.noun} between {low:g} and {price:g} {cur}", f"{p.noun}s priced {low:g}-{price:g} {cur}")
            )
            args.update(min_price=low, max_price=price, currency=cur)
        elif variant == 4 and p.sized:
            size = rng.choice(SIZES[:6] if p.category == "apparel" else SIZES[6:])
            text = rng.choice(
                (
                    f"{p.noun} in size {size}",
                    f"{p.color} {p.noun} size {size}",
                    f"do you have the {p.brand} {p.noun} in {size}?",
                )
            )
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
            text = rng.choice(
                (f"{p.brand} {p.noun} under {price:g} {cur}", f"{p.noun} by {p.brand} max {price:g} {cur}")
            )
            args.update(brand=p.brand, max_price=price, currency=cur)
        return text

    def _i_get_product(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        p = self._product(rng)
        text = rng.choice(
            (
                f"tell me more about {p.product_id}",
                f"is {p.product_id} in stock?",
                f"details for item {p.product_id} please",
                f"what colors does {p.product_id} come in",
                f"specs of {p.product_id}",
            )
        )
        return _Turn(text, "get_product", {"product_id": p.product_id}, {"product_id": p.product_id, "in_stock": True})

    def _i_create_order(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        p = self._product(rng)
        qty = rng.choice((1, 1, 1, 2, 3, 4))
        args: dict[str, Any] = {"items": [{"product_id": p.product_id, "quantity": qty}], "currency": customer.currency}
        if rng.random() < 0.4:
            address = self._address(rng)
            text = rng.choice(
                (
                    f"order {qty} of {p.product_id} and ship to {address}",
                    f"buy {p.product_id} x{qty}, deliver to {address}",
                )
            )
            args["shipping_address"] = address
        else:
            text = rng.choice(
                (
                    f"buy {qty} of {p.product_id}",
                    f"I'll take {qty} x {p.product_id}",
                    f"place an order for {p.product_id}, quantity {qty}",
                    f"add {qty} {p.product_id} to an order and check out",
                )
            )
        return _Turn(text, "create_order", args, {"order_id": _id(rng, "ORD"), "status": "CREATED"})

    def _i_get_order(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        oid = _id(rng, "ORD")
        text = rng.choice(
            (
                f"where is my order {oid}",
                f"status of order {oid}?",
                f"has {oid} been paid?",
                f"what's going on with {oid}",
                f"check order {oid} for me",
            )
        )
        return _Turn(
            text, "get_order", {"order_id": oid}, {"order_id": oid, "status": rng.choice(("APPROVED", "COMPLETED"))}
        )

    def _i_capture_order(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        oid = _id(rng, "ORD")
        if rng.random() < 0.5:
            amount = _round_price(20 + rng.random() * 480)
            text = rng.choice(
                (
                    f"capture {amount:g} {customer.currency} on order {oid}",
                    f"charge {amount:g} {customer.currency} for {oid} now",
                )
            )
            args = {"order_id": oid, "amount": amount, "currency": customer.currency}
        else:
            text = rng.choice((f"capture payment for order {oid}", f"capture {oid}", f"finalize the payment on {oid}"))
            args = {"order_id": oid}
        return _Turn(text, "capture_order", args, {"status": "COMPLETED"})

    def _i_create_invoice(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        client = rng.choice(cat.customers(5000)[:400])
        email = self._email(rng, client)
        amount = _round_price(30 + rng.lognormvariate(5, 0.8))
        what = rng.choice(
            (
                "web design work",
                "consulting hours",
                "catering for the event",
                "october retainer",
                "photography session",
                "custom furniture",
            )
        )
        args: dict[str, Any] = {"recipient_email": email, "amount": amount, "currency": customer.currency}
        if rng.random() < 0.5:
            due = (day + timedelta(days=rng.choice((7, 14, 30)))).isoformat()
            text = rng.choice(
                (
                    f"invoice {email} {amount:g} {customer.currency} for {what}, due {due}",
                    f"bill {email} for {what}: {amount:g} {customer.currency}, payment due {due}",
                )
            )
            args.update(description=what, due_date=due)
        else:
            text = rng.choice(
                (
                    f"create an invoice for {email} of {amount:g} {customer.currency}",
                    f"new invoice to {email}, {amount:g} {customer.currency}",
                )
            )
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
            text = rng.choice(
                (
                    f"show my {status.lower()} invoices",
                    f"list {status.lower()} invoices",
                    f"which invoices are {status.lower()}?",
                )
            )
            args: dict[str, Any] = {"status": status}
        else:
            start = day - timedelta(days=rng.choice((7, 30, 90)))
            text = rng.choice(
                (
                    f"list invoices from {start.isoformat()} to {day.isoformat()}",
                    f"invoices between {start.isoformat()} and {day.isoformat()}",
                )
            )
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
            text = rng.choice(
                (
                    f"track {tracking} ({carrier})",
                    f"where is package {tracking} with {carrier}",
                    f"{carrier} tracking {tracking}",
                )
            )
            args: dict[str, Any] = {"tracking_number": tracking, "carrier": carrier}
        else:
            oid = _id(rng, "ORD")
            text = rng.choice(
                (
                    f"where's the package for order {oid}",
                    f"when will {oid} arrive?",
                    f"track my shipment for {oid}",
                    f"has {oid} shipped yet",
                )
            )
            args = {"order_id": oid}
        return _Turn(text, "track_shipment", args, {"status": rng.choice(("IN_TRANSIT", "DELIVERED"))})

    def _i_search_transactions(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        start = day - timedelta(days=rng.choice((1, 7, 14, 30, 60)))
        s, e = start.isoformat(), day.isoformat()
        args: dict[str, Any] = {"start_date": s, "end_date": e}
        r = rng.random()
        if r < 0.35:
            amount = _round_price(50 + rng.random() * 950)
            text = rng.choice(
                (
                    f"payments over {amount:g} {customer.currency} from {s} to {e}",
                    f"transactions above {amount:g} {customer.currency} between {s} and {e}",
                )
            )
            args.update(min_amount=amount, currency=customer.currency)
        elif r < 0.6:
            status = rng.choice(("REFUNDED", "DENIED", "PENDING"))
            text = rng.choice(
                (f"{status.lower()} transactions since {s}", f"show {status.lower()} payments {s} to {e}")
            )
            args["status"] = status
        else:
            text = rng.choice(
                (
                    f"show transactions from {s} to {e}",
                    f"all payments between {s} and {e}",
                    f"transaction history {s} - {e}",
                )
            )
        return _Turn(text, "search_transactions", args, {"count": int(rng.random() * 200)})

    def _i_create_subscription(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        plan = rng.choice(("P-BASIC-MONTHLY", "P-PRO-MONTHLY", "P-PRO-ANNUAL", "P-TEAM-ANNUAL", "P-COFFEE-CLUB"))
        if rng.random() < 0.4:
            qty = rng.choice((2, 5, 10, 25))
            start = (day + timedelta(days=rng.choice((1, 7, 14)))).isoformat()
            text = rng.choice(
                (
                    f"subscribe us to {plan} for {qty} seats starting {start}",
                    f"start {plan} on {start} with {qty} seats",
                )
            )
            args: dict[str, Any] = {"plan_id": plan, "start_date": start, "quantity": qty}
        else:
            text = rng.choice((f"subscribe me to plan {plan}", f"sign me up for {plan}", f"I want the {plan} plan"))
            args = {"plan_id": plan}
        return _Turn(text, "create_subscription", args, {"subscription_id": _id(rng, "I")})

    def _i_cancel_subscription(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        sid = _id(rng, "I")
        reason = rng.choice(
            (
                "too expensive",
                "not using it anymore",
                "switching to another provider",
                "moving abroad",
                "the service was unreliable",
            )
        )
        text = rng.choice(
            (
                f"cancel subscription {sid} because it's {reason}",
                f"please cancel {sid}, {reason}",
                f"stop {sid}: {reason}",
            )
        )
        return _Turn(text, "cancel_subscription", {"subscription_id": sid, "reason": reason}, {"status": "CANCELLED"})

    def _i_get_subscription(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        sid = _id(rng, "I")
        text = rng.choice(
            (f"when is the next billing for {sid}?", f"status of subscription {sid}", f"is {sid} still active?")
        )
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
        text = rng.choice(
            (f"what's happening with dispute {did}?", f"details of {did}", f"when do I need to respond to {did}")
        )
        return _Turn(text, "get_dispute", {"dispute_id": did}, {"status": "UNDER_REVIEW"})

    def _i_abstain(self, rng: random.Random, customer: cat.Customer, day: date) -> _Turn:
        text, answer = rng.choice(
            (
                ("thanks, that's all", "You're welcome! Anything else I can help with?"),
                ("what's your return policy?", "Items can be returned within 30 days of delivery."),
                ("tell me a joke", "I can help with shopping, orders, invoices and payments."),
                ("what's the weather tomorrow?", "I can't check the weather, but I can track your orders."),
                ("hi", "Hi! How can I help with your shopping or payments today?"),
                ("can I talk to a human?", "I'll connect you with a support agent."),
            )
        )
        return _Turn(text, NO_TOOL, None, {"message": answer})
