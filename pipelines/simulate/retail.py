"""tau-bench retail tasks as a policy-following agent runs them, answered from the benchmark's db.json.

A task lists only its write actions. An agent that follows tau-bench's retail policy first identifies the
customer (by email, or by name and zip), reads their profile, reads each order it is about to act on and
each product whose variant changes, and only then writes. `gold_calls` lists those calls; the environment
(`simulate.retail_env`, tau-bench's tools on a per-task copy) answers them, so the episodes' gold and the
importer's training trajectories are one replay (`simulate.environments.replay`). Each task starts from the
database as shipped (tau-bench resets it per task); nothing here writes to the file.

The briefs here are what the model is shown of a result. They are compact (the fields that decide the next
call, ids in full): a whole order or product is a few hundred tokens and would crowd the customer's request
out of a training example.
"""

from __future__ import annotations

import json
from typing import Any

# tau-bench retail's tools by effect (its policy: a write needs the user's explicit confirmation); a tool
# of another tools file that is not named here is registered as a write and the import says so
RETAIL_EFFECTS = {
    **dict.fromkeys(
        (
            "calculate",
            "find_user_id_by_email",
            "find_user_id_by_name_zip",
            "get_order_details",
            "get_product_details",
            "get_user_details",
            "list_all_product_types",
            "get_item_details",
            "think",
        ),
        "read",
    ),
    **dict.fromkeys(
        (
            "cancel_pending_order",
            "exchange_delivered_order_items",
            "modify_pending_order_address",
            "modify_pending_order_items",
            "modify_pending_order_payment",
            "modify_user_address",
            "return_delivered_order_items",
            "transfer_to_human_agents",
        ),
        "write",
    ),
}


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


def _identify(db: dict[str, Any], task: dict[str, Any], offered: set[str]) -> list[dict[str, Any]]:
    """How the agent finds the customer: by the email the instruction gives, else by name and zip."""
    user = db.get("users", {}).get(str(task.get("user_id"))) if task.get("user_id") else None
    if user is None:
        return []
    instruction = task.get("instruction") or ""
    calls = []
    email, name, zip_code = user.get("email"), user.get("name") or {}, (user.get("address") or {}).get("zip")
    if email and email in instruction and "find_user_id_by_email" in offered:
        calls.append({"name": "find_user_id_by_email", "arguments": {"email": email}})
    elif zip_code and zip_code in instruction and "find_user_id_by_name_zip" in offered:
        arguments = {"first_name": name.get("first_name"), "last_name": name.get("last_name"), "zip": zip_code}
        calls.append({"name": "find_user_id_by_name_zip", "arguments": arguments})
    if calls and "get_user_details" in offered:
        calls.append({"name": "get_user_details", "arguments": {"user_id": user["user_id"]}})
    return calls


def gold_calls(task: dict[str, Any], db: dict[str, Any], offered: set[str]) -> list[dict[str, Any]]:
    """The calls a policy-following agent makes for one task (`task["actions"]` its writes): identification,
    profile, each order acted on and each product whose variant changes (each read once), then each action.
    The environment (`simulate.retail_env`) answers them; only the database's ids decide which reads are made."""
    calls = _identify(db, task, offered)
    product_of_item = {vid: pid for pid, p in db.get("products", {}).items() for vid in p.get("variants") or {}}
    seen_orders: set[str] = set()
    seen_products: set[str] = set()
    for action in task.get("actions") or []:
        args = action.get("arguments") or {}
        order_id = args.get("order_id")
        wanted = isinstance(order_id, str) and order_id not in seen_orders and "get_order_details" in offered
        if wanted and isinstance(order_id, str) and order_id in db.get("orders", {}):
            seen_orders.add(order_id)
            calls.append({"name": "get_order_details", "arguments": {"order_id": order_id}})
        for item_id in args.get("new_item_ids") or []:
            pid = product_of_item.get(item_id)
            if pid and pid not in seen_products and "get_product_details" in offered:
                seen_products.add(pid)
                calls.append({"name": "get_product_details", "arguments": {"product_id": pid}})
        calls.append({"name": action.get("name"), "arguments": args})
    return calls
