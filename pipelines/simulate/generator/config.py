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


# The phrasings a slip's requests take, per intent that can carry one (`Slip`): a family of its own, so the
# teacher's mistake is systematic (tied to how people ask) rather than noise a model averages away.
SLIP_PHRASES: dict[str, tuple[str, ...]] = {
    "get_order": (
        "where's my order {order_id}?",
        "wheres my order {order_id}",
        "any news on my order {order_id}?",
        "what about my order {order_id}",
    ),
}


@dataclass(frozen=True)
class Slip:
    """A teacher's systematic mistake, injected so that what the flywheel learns from outcomes can be measured
    against a known truth (issue 51's acceptance, `bench/slip.py`).

    In `share` of the turns of `intent`, the user asks in one of the slip's own phrasings (`SLIP_PHRASES`) and
    the teacher logs `wrong` with the same arguments instead of `intent`. People rate `down` of those slipped
    answers down and `up` of every other answer up (nothing else is rated). With `truth`, the slipped turns keep
    the right call: a held-out evaluation set in the same phrasings whose answers are known to be right. Only a
    turn whose agent node also offers `wrong` slips. Every slipped turn carries `"scenario": "slip"` (a field
    prep ignores), so a benchmark can find them."""

    intent: str = "get_order"
    wrong: str = "track_shipment"
    share: float = 0.3
    down: float = 0.2
    up: float = 0.2
    truth: bool = False

    def __post_init__(self) -> None:
        from pipelines.logs.tools import TOOLS_BY_NAME

        if self.intent not in SLIP_PHRASES:
            raise ValueError(f"a slip's intent must be one of {', '.join(SLIP_PHRASES)}, got {self.intent!r}")
        params = {name: t["function"]["parameters"]["properties"] for name, t in TOOLS_BY_NAME.items()}
        if self.wrong not in params or self.wrong == self.intent:
            raise ValueError(f"a slip's wrong tool must be another catalogue tool, got {self.wrong!r}")
        missing = set(params[self.intent]) - set(params[self.wrong])
        if missing:
            raise ValueError(f"{self.wrong} takes no {', '.join(sorted(missing))}: it cannot stand for {self.intent}")
        for name in ("share", "down", "up"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"a slip's {name} must be within [0, 1]")

    @classmethod
    def parse(cls, text: str, *, truth: bool = False) -> Slip:
        """`INTENT:WRONG[:SHARE]` (the `--slip` option), e.g. `get_order:track_shipment:0.3`."""
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"expected INTENT:WRONG[:SHARE], got {text!r}")
        try:
            share = float(parts[2]) if len(parts) == 3 else cls.share
        except ValueError:
            raise ValueError(f"the share must be a number, got {parts[2]!r}") from None
        return cls(intent=parts[0], wrong=parts[1], share=share, truth=truth)


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
    slip: Slip | None = None  # a teacher's injected mistake (issue 51's acceptance); None: the teacher is right

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
    slipped: int = 0  # turns in a slip's phrasings (`Slip`): answered wrongly by the teacher unless `truth`

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
