"""tau-bench retail as a live environment: each tool executed as the benchmark defines it, on a per-episode copy.

Reads answer from the database; writes change the episode's copy only (refunds, gift-card balances, item swaps
and the order's new status, as tau-bench's tools apply them); an unknown id or a forbidden state change (cancel
an order that is not pending, exchange one not delivered, pay with a method the customer does not hold) returns
the benchmark's own `Error: ...` line and changes nothing. An episode is judged by the state it leaves:
`state_hash` of the final copy against the hash of the gold actions replayed on a fresh one (any path to the
gold state passes), as tau-bench scores it.

What the model is shown of a result (`Step.observation`) is the compact brief the importer trains on
(`simulate.retail`): the fields that decide the next call, every id in full. The benchmark's own result
string is kept beside it (`Step.result`) for the report.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import orjson

from pipelines.simulate.environments import Step, ToolFailed
from pipelines.simulate.retail import RETAIL_EFFECTS, order_brief, product_brief, user_brief

REASONS = ("no longer needed", "ordered by mistake")
TERMINAL = ("transfer_to_human_agents",)  # the episode ends when the agent hands over


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _address(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in ("address1", "address2", "city", "state", "country", "zip")}


def _count_ok(wanted: list[str], order: dict[str, Any]) -> str | None:
    """The first id asked for more often than the order holds it (duplicates count), else None."""
    held = [item["item_id"] for item in order["items"]]
    return next((i for i in wanted if wanted.count(i) > held.count(i)), None)


class RetailEnvironment:
    """One episode's shop: `reset()` takes a fresh copy of the database, `step()` runs one tool on it."""

    name = "retail"

    def __init__(self, db: dict[str, Any] | None = None, pristine: bytes | None = None):
        self._pristine = pristine if pristine is not None else orjson.dumps(db or {})
        self.data: dict[str, Any] = orjson.loads(self._pristine)
        self._tools: dict[str, Callable[..., str]] = {
            "calculate": self.calculate,
            "cancel_pending_order": self.cancel_pending_order,
            "exchange_delivered_order_items": self.exchange_delivered_order_items,
            "find_user_id_by_email": self.find_user_id_by_email,
            "find_user_id_by_name_zip": self.find_user_id_by_name_zip,
            "get_item_details": self.get_item_details,
            "get_order_details": self.get_order_details,
            "get_product_details": self.get_product_details,
            "get_user_details": self.get_user_details,
            "list_all_product_types": self.list_all_product_types,
            "modify_pending_order_address": self.modify_pending_order_address,
            "modify_pending_order_items": self.modify_pending_order_items,
            "modify_pending_order_payment": self.modify_pending_order_payment,
            "modify_user_address": self.modify_user_address,
            "return_delivered_order_items": self.return_delivered_order_items,
            "think": self.think,
            "transfer_to_human_agents": self.transfer_to_human_agents,
        }

    # -- the episode ------------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.data = orjson.loads(self._pristine)

    def fork(self) -> RetailEnvironment:
        """Another episode's environment over the same database (the pristine bytes shared, not copied)."""
        return RetailEnvironment(pristine=self._pristine)

    def tool_names(self) -> list[str]:
        return sorted(self._tools)

    def effects(self) -> dict[str, str]:
        return dict(RETAIL_EFFECTS)

    def gold_path(self, task: dict[str, Any], actions: list[dict[str, Any]], offered: set[str]) -> list[dict[str, Any]]:
        """The calls a policy-following agent makes for `task` (`simulate.retail.gold_calls`): identify the
        customer, read the profile, each order acted on and each product whose variant changes, then write."""
        from pipelines.simulate.retail import gold_calls

        return gold_calls({**task, "actions": actions}, self._db_view(), offered)

    def _db_view(self) -> dict[str, Any]:
        """The database as shipped, parsed once per environment (read only)."""
        if getattr(self, "_view", None) is None:
            self._view: dict[str, Any] | None = orjson.loads(self._pristine)
        return self._view or {}

    def state_hash(self) -> str:
        """sha256 of the state as canonical JSON (keys sorted): equal states hash equal, whatever the order
        the writes were made in."""
        return hashlib.sha256(orjson.dumps(self.data, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def snapshot(self) -> dict[str, Any]:
        return orjson.loads(orjson.dumps(self.data))

    def step(self, name: str, arguments: dict[str, Any]) -> Step:
        """Run one call. A call the tool cannot take (an unknown tool, a missing or unexpected argument) gets
        the benchmark's error line, as tau-bench returns it; an exception inside the tool raises ToolFailed
        (the episode ends as failed, the error recorded)."""
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return Step(f"Unknown action {name}", f"Unknown action {name}", error=True)
        try:
            inspect.signature(tool).bind(**arguments)
        except TypeError as exc:
            return Step(f"Error: {exc}", f"Error: {exc}", error=True)
        try:
            result = tool(**arguments)
        except Exception as exc:  # noqa: BLE001 (a tool's own failure: the runner ends the episode with it)
            raise ToolFailed(f"{name}: {type(exc).__name__}: {exc}") from exc
        error = result.startswith("Error")
        return Step(result, result if error else self._observation(name, arguments, result), error=error)

    def ends_episode(self, name: str) -> bool:
        return name in TERMINAL

    def _observation(self, name: str, arguments: dict[str, Any], result: str) -> str:
        """The brief the model sees: users, orders and products as the importer's training data shows them."""
        if name in ("get_user_details", "modify_user_address"):
            return user_brief(self.data["users"][arguments["user_id"]])
        if name == "get_product_details":
            return product_brief(self.data["products"][arguments["product_id"]])
        if "order_id" in arguments and name != "get_item_details":
            return order_brief(self.data["orders"][arguments["order_id"]], arguments["order_id"])
        return result

    # -- reads ------------------------------------------------------------------------------------------------
    def calculate(self, expression: str) -> str:
        if not all(ch in "0123456789+-*/(). " for ch in str(expression)):
            return "Error: invalid characters in expression"
        try:
            import ast
            import operator

            ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

            def value(node: ast.AST) -> float:
                if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
                    return float(node.value)
                if isinstance(node, ast.BinOp) and type(node.op) in ops:
                    return ops[type(node.op)](value(node.left), value(node.right))
                if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
                    return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
                raise ValueError("invalid expression")

            return str(round(value(ast.parse(str(expression), mode="eval").body), 2))
        except Exception as exc:  # noqa: BLE001 (the benchmark answers a bad expression with its error)
            return f"Error: {exc}"

    def find_user_id_by_email(self, email: str) -> str:
        for user_id, profile in self.data["users"].items():
            if profile["email"].lower() == str(email).lower():
                return user_id
        return "Error: user not found"

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:  # noqa: A002 (the tool's name)
        for user_id, p in self.data["users"].items():
            if (
                p["name"]["first_name"].lower() == str(first_name).lower()
                and p["name"]["last_name"].lower() == str(last_name).lower()
                and p["address"]["zip"] == zip
            ):
                return user_id
        return "Error: user not found"

    def get_order_details(self, order_id: str) -> str:
        order = self.data["orders"].get(order_id)
        return _dumps(order) if order is not None else "Error: order not found"

    def get_product_details(self, product_id: str) -> str:
        product = self.data["products"].get(product_id)
        return _dumps(product) if product is not None else "Error: product not found"

    def get_user_details(self, user_id: str) -> str:
        user = self.data["users"].get(user_id)
        return _dumps(user) if user is not None else "Error: user not found"

    def get_item_details(self, item_id: str) -> str:
        for product in self.data["products"].values():
            variant = (product.get("variants") or {}).get(item_id)
            if variant is not None:
                return _dumps({**variant, "product_id": product["product_id"], "name": product["name"]})
        return "Error: item not found"

    def list_all_product_types(self) -> str:
        return _dumps(dict(sorted((p["name"], p["product_id"]) for p in self.data["products"].values())))

    def think(self, thought: str) -> str:
        return ""

    # -- writes -----------------------------------------------------------------------------------------------
    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    def _order(self, order_id: str, status: str, verb: str) -> dict[str, Any] | str:
        order = self.data["orders"].get(order_id)
        if order is None:
            return "Error: order not found"
        if order["status"] != status:
            return f"Error: non-{status} order cannot be {verb}"
        return order

    def _method(self, order: dict[str, Any], payment_method_id: str) -> dict[str, Any] | None:
        return self.data["users"][order["user_id"]]["payment_methods"].get(payment_method_id)

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        order = self._order(order_id, "pending", "cancelled")
        if isinstance(order, str):
            return order
        if reason not in REASONS:
            return "Error: invalid reason"
        refunds = []
        for payment in order["payment_history"]:
            pid = payment["payment_method_id"]
            refunds.append({"transaction_type": "refund", "amount": payment["amount"], "payment_method_id": pid})
            if "gift_card" in pid:  # a gift card is refunded at once
                method = self.data["users"][order["user_id"]]["payment_methods"][pid]
                method["balance"] = round(method["balance"] + payment["amount"], 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return _dumps(order)

    def _price_difference(self, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str]) -> float | str:
        missing = _count_ok(item_ids, order)
        if missing is not None:
            return f"Error: {missing} not found"
        if len(item_ids) != len(new_item_ids):
            return "Error: the number of items to be exchanged should match"
        diff = 0.0
        for old_id, new_id in zip(item_ids, new_item_ids):
            item = next(i for i in order["items"] if i["item_id"] == old_id)
            variants = self.data["products"][item["product_id"]]["variants"]
            if not (new_id in variants and variants[new_id]["available"]):
                return f"Error: new item {new_id} not found or available"
            diff += variants[new_id]["price"] - item["price"]
        return diff

    def exchange_delivered_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        order = self._order(order_id, "delivered", "exchanged")
        if isinstance(order, str):
            return order
        diff = self._price_difference(order, item_ids, new_item_ids)
        if isinstance(diff, str):
            return diff
        diff = round(diff, 2)
        method = self._method(order, payment_method_id)
        if method is None:
            return "Error: payment method not found"
        if method["source"] == "gift_card" and method["balance"] < diff:
            return "Error: insufficient gift card balance to pay for the price difference"
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = diff
        return _dumps(order)

    def modify_pending_order_address(
        self,
        order_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,  # noqa: A002 (the tool's argument)
    ) -> str:
        order = self._order(order_id, "pending", "modified")
        if isinstance(order, str):
            return order
        order["address"] = _address(locals())
        return _dumps(order)

    def modify_pending_order_items(
        self, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
    ) -> str:
        order = self._order(order_id, "pending", "modified")
        if isinstance(order, str):
            return order
        diff = self._price_difference(order, item_ids, new_item_ids)
        if isinstance(diff, str):
            return diff
        method = self._method(order, payment_method_id)
        if method is None:
            return "Error: payment method not found"
        if method["source"] == "gift_card" and method["balance"] < diff:
            return "Error: insufficient gift card balance to pay for the new item"
        order["payment_history"].append(
            {
                "transaction_type": "payment" if diff > 0 else "refund",
                "amount": abs(diff),
                "payment_method_id": payment_method_id,
            }
        )
        if method["source"] == "gift_card":
            method["balance"] = round(method["balance"] - diff, 2)
        for old_id, new_id in zip(item_ids, new_item_ids):
            item = next(i for i in order["items"] if i["item_id"] == old_id)
            variant = self.data["products"][item["product_id"]]["variants"][new_id]
            item["item_id"], item["price"], item["options"] = new_id, variant["price"], variant["options"]
        order["status"] = "pending (item modified)"
        return _dumps(order)

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> str:
        order = self._order(order_id, "pending", "modified")
        if isinstance(order, str):
            return order
        method = self._method(order, payment_method_id)
        if method is None:
            return "Error: payment method not found"
        history = order["payment_history"]
        if len(history) > 1 or history[0]["transaction_type"] != "payment":
            return "Error: there should be exactly one payment for a pending order"
        old_id = history[0]["payment_method_id"]
        if old_id == payment_method_id:
            return "Error: the new payment method should be different from the current one"
        amount = history[0]["amount"]
        if method["source"] == "gift_card" and method["balance"] < amount:
            return "Error: insufficient gift card balance to pay for the order"
        history.extend(
            [
                {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
                {"transaction_type": "refund", "amount": amount, "payment_method_id": old_id},
            ]
        )
        if method["source"] == "gift_card":
            method["balance"] = round(method["balance"] - amount, 2)
        if "gift_card" in old_id:
            old = self.data["users"][order["user_id"]]["payment_methods"][old_id]
            old["balance"] = round(old["balance"] + amount, 2)
        return _dumps(order)

    def modify_user_address(
        self,
        user_id: str,
        address1: str,
        address2: str,
        city: str,
        state: str,
        country: str,
        zip: str,  # noqa: A002 (the tool's argument)
    ) -> str:
        user = self.data["users"].get(user_id)
        if user is None:
            return "Error: user not found"
        user["address"] = _address(locals())
        return _dumps(user)

    def return_delivered_order_items(self, order_id: str, item_ids: list[str], payment_method_id: str) -> str:
        order = self._order(order_id, "delivered", "returned")
        if isinstance(order, str):
            return order
        if self._method(order, payment_method_id) is None:
            return "Error: payment method not found"
        if (
            "gift_card" not in payment_method_id
            and payment_method_id != order["payment_history"][0]["payment_method_id"]
        ):
            return "Error: payment method should be either the original payment method or a gift card"
        if _count_ok(item_ids, order) is not None:
            return "Error: some item not found"
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return _dumps(order)
