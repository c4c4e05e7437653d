"""tau-bench retail tasks as a policy-following agent runs them, answered from the benchmark's db.json.

A task lists only its write actions. An agent that follows tau-bench's retail policy first identifies the
customer (by email, or by name and zip), reads their profile, reads each order it is about to act on and
each product whose variant changes, and only then writes. `trajectory` rebuilds those steps: every read's
result is what the database holds, and every write's result is the write applied to the database (the
cancelled order, the new address), so a later lookup in the same task shows the new state. Each task starts
from the database as shipped (tau-bench resets it per task); nothing here writes to the file.

The results are compact (the fields that decide the next call, ids in full): a whole order or product is a
few hundred tokens and would crowd the customer's request out of a training example.
"""

from __future__ import annotations

import copy
import json
from typing import Any

# the state an order is left in by each write (tau-bench retail's tools)
_ORDER_STATUS = {
    "cancel_pending_order": "cancelled",
    "modify_pending_order_items": "pending (item modified)",
    "return_delivered_order_items": "return requested",
    "exchange_delivered_order_items": "exchange requested",
}
READS = (
    "find_user_id_by_email",
    "find_user_id_by_name_zip",
    "get_user_details",
    "get_order_details",
    "get_product_details",
)


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _address(a: dict[str, Any] | None) -> str:
    a = a or {}
    parts = [
        a.get("address1"),
        a.get("address2"),
        a.get("city"),
        f"{a.get('state', '')} {a.get('zip', '')}".strip(),
        a.get("country"),
    ]
    return ", ".join(str(p) for p in parts if p)


def user_brief(user: dict[str, Any]) -> str:
    name = user.get("name") or {}
    methods = []
    for pid, m in sorted((user.get("payment_methods") or {}).items()):
        extra = m.get("brand") and f" {m['brand']} {m.get('last_four', '')}".rstrip()
        methods.append(f"{pid} ({m.get('source', '')}{extra or ''})")
    return _dump(
        {
            "user_id": user.get("user_id"),
            "name": f"{name.get('first_name', '')} {name.get('last_name', '')}".strip(),
            "address": _address(user.get("address")),
            "email": user.get("email"),
            "payment_methods": methods,
            "orders": list(user.get("orders") or []),
        }
    )


def order_brief(order: dict[str, Any], order_id: str) -> str:
    brief: dict[str, Any] = {
        "order_id": order.get("order_id", order_id),
        "status": order.get("status"),
        "address": _address(order.get("address")),
        "items": [
            {
                "name": i.get("name"),
                "item_id": i.get("item_id"),
                "product_id": i.get("product_id"),
                "options": i.get("options"),
            }
            for i in order.get("items") or []
        ],
        "payment_method_ids": sorted(
            {p.get("payment_method_id") for p in order.get("payment_history") or [] if p.get("payment_method_id")}
        ),
    }
    for key in ("cancel_reason", "return_items", "exchange_items", "exchange_new_items"):
        if order.get(key):
            brief[key] = order[key]
    return _dump(brief)


def product_brief(product: dict[str, Any]) -> str:
    variants = {
        vid: ", ".join(
            [
                *(f"{k} {v}" for k, v in (var.get("options") or {}).items()),
                "available" if var.get("available") else "unavailable",
                f"{var.get('price')}",
            ]
        )
        for vid, var in sorted((product.get("variants") or {}).items())
    }
    return _dump({"product_id": product.get("product_id"), "name": product.get("name"), "variants": variants})


class Shop:
    """One task's view of the database: reads answer from it, writes change this copy only."""

    def __init__(self, db: dict[str, Any]):
        self.db = db
        self.changed: dict[tuple[str, str], dict[str, Any]] = {}
        self.product_of_item = {
            vid: pid for pid, p in db.get("products", {}).items() for vid in p.get("variants") or {}
        }

    def _get(self, table: str, key: str) -> dict[str, Any] | None:
        if (table, key) in self.changed:
            return self.changed[(table, key)]
        row = self.db.get(table, {}).get(key)
        return row

    def _own(self, table: str, key: str) -> dict[str, Any] | None:
        if (table, key) not in self.changed:
            row = self.db.get(table, {}).get(key)
            if row is None:
                return None
            self.changed[(table, key)] = copy.deepcopy(row)
        return self.changed[(table, key)]

    def user(self, user_id: str) -> dict[str, Any] | None:
        return self._get("users", user_id)

    def order(self, order_id: str) -> dict[str, Any] | None:
        return self._get("orders", order_id)

    def product(self, product_id: str) -> dict[str, Any] | None:
        return self._get("products", product_id)

    def _variant(self, item_id: str) -> dict[str, Any] | None:
        pid = self.product_of_item.get(item_id)
        product = self.product(pid) if pid else None
        variant = (product or {}).get("variants", {}).get(item_id)
        if variant is None or product is None:  # no product: no variant either
            return None
        return {
            "name": product.get("name"),
            "product_id": pid,
            "item_id": item_id,
            "price": variant.get("price"),
            "options": variant.get("options"),
        }

    def apply(self, name: str, args: dict[str, Any]) -> str | None:
        """The write's result as the tool returns it (the changed order or user), or None when the database
        does not hold what it acts on."""
        if name == "transfer_to_human_agents":
            return "Transfer successful"
        if name == "modify_user_address":
            user = self._own("users", str(args.get("user_id")))
            if user is None:
                return None
            user["address"] = {k: args.get(k) for k in ("address1", "address2", "city", "state", "country", "zip")}
            return user_brief(user)
        order = self._own("orders", str(args.get("order_id")))
        if order is None:
            return None
        if name in _ORDER_STATUS:
            order["status"] = _ORDER_STATUS[name]
        if name == "cancel_pending_order":
            order["cancel_reason"] = args.get("reason")
        elif name == "modify_pending_order_address":
            order["address"] = {k: args.get(k) for k in ("address1", "address2", "city", "state", "country", "zip")}
        elif name == "modify_pending_order_payment":
            order.setdefault("payment_history", []).append(
                {"transaction_type": "payment", "payment_method_id": args.get("payment_method_id")}
            )
            order["payment_history"] = [
                p for p in order["payment_history"] if p.get("payment_method_id") == args.get("payment_method_id")
            ]
        elif name == "modify_pending_order_items":
            swaps = dict(zip(args.get("item_ids") or [], args.get("new_item_ids") or []))
            items = []
            for item in order.get("items") or []:
                new = self._variant(swaps[item.get("item_id")]) if item.get("item_id") in swaps else None
                items.append(new or item)
            order["items"] = items
        elif name == "return_delivered_order_items":
            order["return_items"] = sorted(args.get("item_ids") or [])
        elif name == "exchange_delivered_order_items":
            order["exchange_items"] = sorted(args.get("item_ids") or [])
            order["exchange_new_items"] = sorted(args.get("new_item_ids") or [])
        return order_brief(order, str(args.get("order_id")))


def _identify(shop: Shop, task: dict[str, Any], offered: set[str]) -> list[tuple[dict[str, Any], str]]:
    """How the agent finds the customer: by the email the instruction gives, else by name and zip."""
    user = shop.user(str(task.get("user_id"))) if task.get("user_id") else None
    if user is None:
        return []
    instruction = task.get("instruction") or ""
    steps = []
    email, name, zip_code = user.get("email"), user.get("name") or {}, (user.get("address") or {}).get("zip")
    if email and email in instruction and "find_user_id_by_email" in offered:
        steps.append(({"name": "find_user_id_by_email", "arguments": {"email": email}}, user["user_id"]))
    elif zip_code and zip_code in instruction and "find_user_id_by_name_zip" in offered:
        steps.append(
            (
                {
                    "name": "find_user_id_by_name_zip",
                    "arguments": {
                        "first_name": name.get("first_name"),
                        "last_name": name.get("last_name"),
                        "zip": zip_code,
                    },
                },
                user["user_id"],
            )
        )
    if steps and "get_user_details" in offered:
        steps.append(({"name": "get_user_details", "arguments": {"user_id": user["user_id"]}}, user_brief(user)))
    return steps


def trajectory(
    task: dict[str, Any], db: dict[str, Any], offered: set[str], skipped: set[str], unrecorded: str
) -> list[tuple[dict[str, Any], str, str]]:
    """[(call, its result, "read" or "write")] for one task: identification, profile, each touched order
    and each product whose variant changes, then each write applied to the database. A write the database
    cannot apply (an order it does not hold) keeps the source's `unrecorded` result."""
    shop = Shop(db)
    steps: list[tuple[dict[str, Any], str, str]] = [(c, r, "read") for c, r in _identify(shop, task, offered)]
    seen_orders: set[str] = set()
    seen_products: set[str] = set()
    for action in (a for a in task.get("actions") or [] if a.get("name") not in skipped):
        args = action.get("arguments") or {}
        order_id = args.get("order_id")
        if isinstance(order_id, str) and order_id not in seen_orders and "get_order_details" in offered:
            order = shop.order(order_id)
            if order is not None:
                seen_orders.add(order_id)
                steps.append(
                    (
                        {"name": "get_order_details", "arguments": {"order_id": order_id}},
                        order_brief(order, order_id),
                        "read",
                    )
                )
        for item_id in args.get("new_item_ids") or []:
            pid = shop.product_of_item.get(item_id)
            if pid and pid not in seen_products and "get_product_details" in offered:
                seen_products.add(pid)
                steps.append(
                    (
                        {"name": "get_product_details", "arguments": {"product_id": pid}},
                        product_brief(shop.product(pid) or {}),
                        "read",
                    )
                )
        if action.get("name") in READS:
            result = _read(shop, action)
            steps.append((action, result if result is not None else unrecorded, "read"))
            continue
        result = shop.apply(str(action.get("name")), args)
        steps.append((action, result if result is not None else unrecorded, "write"))
    return steps


def _read(shop: Shop, action: dict[str, Any]) -> str | None:
    args = action.get("arguments") or {}
    if action["name"] == "get_order_details" and shop.order(str(args.get("order_id"))):
        return order_brief(shop.order(str(args["order_id"])) or {}, str(args["order_id"]))
    if action["name"] == "get_user_details" and shop.user(str(args.get("user_id"))):
        return user_brief(shop.user(str(args["user_id"])) or {})
    if action["name"] == "get_product_details" and shop.product(str(args.get("product_id"))):
        return product_brief(shop.product(str(args["product_id"])) or {})
    return None
