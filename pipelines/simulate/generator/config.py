"""What to generate: the knobs (`GeneratorConfig`), the kinds of bad records and drift scenarios,
the tool mix, and the summary of a run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Any

from pipelines.logs.luhn import luhn_complete, luhn_valid  # noqa: F401 (re-exported)
from pipelines.logs.schema import Reason
from pipelines.logs.tools import (
    NO_TOOL,
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

BASE_TOOL_MIX: dict[str, float] = {
    "search_products": 0.30,
    "get_product": 0.07,
    "create_order": 0.07,
    "get_order": 0.08,
    "capture_order": 0.03,
    "create_invoice": 0.05,
    "send_invoice": 0.03,
    "list_invoices": 0.03,
    "track_shipment": 0.10,
    "search_transactions": 0.06,
    "create_subscription": 0.03,
    "cancel_subscription": 0.03,
    "get_subscription": 0.03,
    "list_disputes": 0.03,
    "get_dispute": 0.03,
    NO_TOOL: 0.03,
}
TOOL_MIX_BOOST = {
    "list_disputes": 6.0,
    "get_dispute": 6.0,
    "create_subscription": 4.0,
    "cancel_subscription": 4.0,
    "get_subscription": 4.0,
    "search_transactions": 3.0,
}
HOLIDAY_CATEGORIES = ("toys", "jewelry", "electronics", "home", "beauty")


@dataclass(frozen=True)
class GeneratorConfig:
    seed: int = 0
    records: int = 10_000
    days: int = 1
    end_date: date = field(default_factory=lambda: datetime.now(UTC).date())
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
