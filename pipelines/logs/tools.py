"""The commerce agent's tools, as OpenAI function schemas, and which agent node offers which.

Modelled on a payment platform's agent toolkit (catalogue search, orders, invoices, shipment
tracking, transactions, subscriptions, disputes). The schemas are the contract: the generator
writes arguments that satisfy them, prep quarantines calls that do not, and the SFT system prompt
shows them to the model. Bump TOOLSET_VERSION whenever a schema changes: it is recorded with every
dataset and model version.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

import jsonschema

TOOLSET_VERSION = "2026.11.1"
NO_TOOL = "<abstain>"  # the expected "tool" of a turn where no offered tool fits (an abstention)

CURRENCIES = ["USD", "EUR", "GBP", "CAD", "AUD", "JPY", "MXN", "BRL", "INR"]
CATEGORIES = [
    "apparel",
    "footwear",
    "electronics",
    "home",
    "kitchen",
    "beauty",
    "sports",
    "toys",
    "jewelry",
    "books",
    "grocery",
    "pet_supplies",
    "garden",
]
SIZES = ["XS", "S", "M", "L", "XL", "XXL", "6", "7", "8", "9", "10", "11", "12"]
COLORS = ["black", "white", "red", "blue", "green", "grey", "beige", "pink", "navy", "brown", "gold", "silver"]
ORDER_STATUSES = ["CREATED", "APPROVED", "COMPLETED", "VOIDED"]
INVOICE_STATUSES = ["DRAFT", "SENT", "PAID", "CANCELLED", "OVERDUE"]
DISPUTE_STATUSES = ["OPEN", "WAITING_FOR_BUYER_RESPONSE", "WAITING_FOR_SELLER_RESPONSE", "UNDER_REVIEW", "RESOLVED"]
CARRIERS = ["UPS", "USPS", "FEDEX", "DHL", "ROYAL_MAIL", "CANADA_POST", "AUSTRALIA_POST"]

_ID = {"type": "string", "minLength": 6, "maxLength": 40, "pattern": "^[A-Za-z0-9_-]+$"}
_DATE = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
_MONEY = {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000}
_CURRENCY = {"type": "string", "enum": CURRENCIES}
_EMAIL = {"type": "string", "minLength": 3, "maxLength": 254, "pattern": "^[^@\\s]+@[^@\\s]+$"}


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOLS: list[dict[str, Any]] = [
    _fn(
        "search_products",
        "Search the product catalogue with optional filters.",
        {
            "query": {"type": "string", "minLength": 1, "maxLength": 200, "description": "Free-text search terms"},
            "category": {"type": "string", "enum": CATEGORIES},
            "brand": {"type": "string", "minLength": 1, "maxLength": 60},
            "min_price": {"type": "number", "minimum": 0},
            "max_price": {"type": "number", "exclusiveMinimum": 0},
            "size": {"type": "string", "enum": SIZES},
            "color": {"type": "string", "enum": COLORS},
            "currency": _CURRENCY,
            "limit": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        ["query"],
    ),
    _fn(
        "get_product",
        "Get one product's details, variants and stock.",
        {
            "product_id": _ID,
        },
        ["product_id"],
    ),
    _fn(
        "create_order",
        "Create an order for one or more products.",
        {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 10,
                "items": {
                    "type": "object",
                    "properties": {"product_id": _ID, "quantity": {"type": "integer", "minimum": 1, "maximum": 100}},
                    "required": ["product_id", "quantity"],
                    "additionalProperties": False,
                },
            },
            "currency": _CURRENCY,
            "shipping_address": {"type": "string", "minLength": 5, "maxLength": 300},
        },
        ["items", "currency"],
    ),
    _fn(
        "get_order",
        "Get an order's status and details.",
        {
            "order_id": _ID,
        },
        ["order_id"],
    ),
    _fn(
        "capture_order",
        "Capture payment for an approved order.",
        {
            "order_id": _ID,
            "amount": _MONEY,
            "currency": _CURRENCY,
        },
        ["order_id"],
    ),
    _fn(
        "create_invoice",
        "Create a draft invoice for a recipient.",
        {
            "recipient_email": _EMAIL,
            "amount": _MONEY,
            "currency": _CURRENCY,
            "description": {"type": "string", "maxLength": 500},
            "due_date": _DATE,
        },
        ["recipient_email", "amount", "currency"],
    ),
    _fn(
        "send_invoice",
        "Send an existing invoice to its recipient.",
        {
            "invoice_id": _ID,
            "note": {"type": "string", "maxLength": 500},
        },
        ["invoice_id"],
    ),
    _fn(
        "list_invoices",
        "List invoices, optionally by status and date range.",
        {
            "status": {"type": "string", "enum": INVOICE_STATUSES},
            "start_date": _DATE,
            "end_date": _DATE,
            "page_size": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        [],
    ),
    _fn(
        "track_shipment",
        "Track a shipment by tracking number or by order.",
        {
            "tracking_number": {"type": "string", "minLength": 8, "maxLength": 40},
            "carrier": {"type": "string", "enum": CARRIERS},
            "order_id": _ID,
        },
        [],
    ),
    _fn(
        "search_transactions",
        "Search payment transactions in a date range.",
        {
            "start_date": _DATE,
            "end_date": _DATE,
            "min_amount": {"type": "number", "minimum": 0},
            "max_amount": {"type": "number", "exclusiveMinimum": 0},
            "currency": _CURRENCY,
            "status": {"type": "string", "enum": ["SUCCESS", "PENDING", "DENIED", "REFUNDED"]},
        },
        ["start_date", "end_date"],
    ),
    _fn(
        "create_subscription",
        "Subscribe a customer to a billing plan.",
        {
            "plan_id": _ID,
            "start_date": _DATE,
            "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        ["plan_id"],
    ),
    _fn(
        "cancel_subscription",
        "Cancel a subscription, with a reason.",
        {
            "subscription_id": _ID,
            "reason": {"type": "string", "minLength": 1, "maxLength": 300},
        },
        ["subscription_id", "reason"],
    ),
    _fn(
        "get_subscription",
        "Get a subscription's status and next billing date.",
        {
            "subscription_id": _ID,
        },
        ["subscription_id"],
    ),
    _fn(
        "list_disputes",
        "List payment disputes, optionally by status.",
        {
            "status": {"type": "string", "enum": DISPUTE_STATUSES},
            "start_date": _DATE,
            "page_size": {"type": "integer", "minimum": 1, "maximum": 50},
        },
        [],
    ),
    _fn(
        "get_dispute",
        "Get one dispute's details and evidence deadlines.",
        {
            "dispute_id": _ID,
        },
        ["dispute_id"],
    ),
]

# What each tool does to the world: a `write` changes it (an order, a payment, an invoice sent, a
# subscription), a `read` only looks. A wrong write is the worst error a tool caller makes: evaluation
# counts wrong writes apart and the promotion gate vetoes a candidate that makes more than its reference.
EFFECTS = ("read", "write")
WRITE_TOOLS = frozenset(
    {"create_order", "capture_order", "create_invoice", "send_invoice", "create_subscription", "cancel_subscription"}
)
TOOL_NAMES: tuple[str, ...] = tuple(t["function"]["name"] for t in TOOLS)
TOOLS_BY_NAME: dict[str, dict[str, Any]] = {t["function"]["name"]: t for t in TOOLS}

# Agent nodes (workload_id) and the tools each one is offered; neighbours overlap on purpose, so
# the model must choose, as the production agent does.
WORKLOAD_TOOLS: dict[str, tuple[str, ...]] = {
    "search_discovery": ("search_products", "get_product", "create_order"),
    "orders": ("create_order", "get_order", "capture_order", "track_shipment", "get_product"),
    "invoicing": ("create_invoice", "send_invoice", "list_invoices"),
    "shipping": ("track_shipment", "get_order"),
    "subscriptions": ("create_subscription", "cancel_subscription", "get_subscription"),
    "disputes": ("list_disputes", "get_dispute", "search_transactions"),
    "transactions": ("search_transactions", "get_order", "list_disputes"),
}
WORKLOADS: tuple[str, ...] = tuple(WORKLOAD_TOOLS)

# The tool each workload mostly exists to call (for mix statistics).
TOOL_WORKLOAD: dict[str, str] = {
    "search_products": "search_discovery",
    "get_product": "search_discovery",
    "create_order": "orders",
    "get_order": "orders",
    "capture_order": "orders",
    "create_invoice": "invoicing",
    "send_invoice": "invoicing",
    "list_invoices": "invoicing",
    "track_shipment": "shipping",
    "search_transactions": "transactions",
    "create_subscription": "subscriptions",
    "cancel_subscription": "subscriptions",
    "get_subscription": "subscriptions",
    "list_disputes": "disputes",
    "get_dispute": "disputes",
}


def tools_for(workload_id: str) -> list[dict[str, Any]]:
    return [TOOLS_BY_NAME[name] for name in WORKLOAD_TOOLS[workload_id]]


def catalogue(extra_tools: Iterable[dict[str, Any]] = ()) -> dict[str, dict[str, Any]]:
    """Tool name -> OpenAI tool spec: ours, plus imported toolsets (ours win on a name clash)."""
    return {**{t["function"]["name"]: t for t in extra_tools}, **TOOLS_BY_NAME}


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(json.loads(schema_json))


def validation_errors(schema: dict[str, Any], instance: Any) -> list[jsonschema.ValidationError]:
    """`instance`'s errors against `schema`, ordered by path (the validator is cached per schema)."""
    checker = _validator(json.dumps(schema, sort_keys=True))
    return sorted(checker.iter_errors(instance), key=lambda e: list(e.absolute_path))


def argument_errors(name: str, arguments: Any, tools: Mapping[str, dict[str, Any]] | None = None) -> list[str]:
    """Why `arguments` do not satisfy tool `name`'s JSON schema (empty when they do)."""
    known = TOOLS_BY_NAME if tools is None else tools
    if name not in known:
        return [f"unknown tool {name!r}"]
    errors = validation_errors(known[name]["function"]["parameters"], arguments)
    return [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


def catalogue_effects() -> dict[str, str]:
    return {name: "write" if name in WRITE_TOOLS else "read" for name in TOOL_NAMES}


def effect_of(name: str | None, effects: Mapping[str, str] | None = None) -> str | None:
    """`read` or `write` for a tool (None for no call); a tool nobody declared is a write (fail safe)."""
    if name is None:
        return None
    return (catalogue_effects() if effects is None else effects).get(name, "write")


def id_arguments(spec: Mapping[str, Any]) -> list[str]:
    """The arguments that name an object the call acts on: declared as `id_arguments` next to the tool's
    `effect`, else every property named `*_id` or `*_ids`."""
    declared = spec.get("id_arguments")
    if isinstance(declared, list):
        return [str(a) for a in declared]
    fn = spec.get("function", spec)
    props = (fn.get("parameters") or {}).get("properties") or {}
    return sorted(k for k in props if k.endswith(("_id", "_ids")))
