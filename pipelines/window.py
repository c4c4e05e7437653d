"""A date window: the unit every stage processes and every task re-runs idempotently."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta


@dataclass(frozen=True)
class DateWindow:
    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"window end {self.end} is before its start {self.start}")

    @classmethod
    def ending(cls, end: date, days: int) -> DateWindow:
        if days < 1:
            raise ValueError("a window has at least one day")
        return cls(end - timedelta(days=days - 1), end)

    @classmethod
    def parse(cls, start: str, end: str) -> DateWindow:
        return cls(date.fromisoformat(start), date.fromisoformat(end))

    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    def isoformat_days(self) -> list[str]:
        return [d.isoformat() for d in self.days()]

    @property
    def label(self) -> str:
        return f"{self.start.isoformat()}_{self.end.isoformat()}"

    def __str__(self) -> str:
        return f"{self.start.isoformat()}..{self.end.isoformat()}"
