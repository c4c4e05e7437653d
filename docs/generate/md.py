"""Markdown pieces and number formats shared by the results renderers.

Numbers: three significant figures; milliseconds as integers; shares (0..1) as percentages; a missing value
as `n/a`; an interval the file does not record as "no interval recorded" (never computed here).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

NO_INTERVAL = "no interval recorded"
Fmt = Callable[[Any], str]


@dataclass
class Body:
    """What a family renderer returns for one results file: the sentence saying what was measured, then blocks."""

    what: str
    blocks: list[str] = field(default_factory=list)


def num(x: Any) -> str:
    """Three significant figures (integers as they are); thousands separated."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if not isinstance(x, float):
        return str(x)
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    digits = 2 - math.floor(math.log10(abs(x)))
    if digits <= 0:
        return f"{round(x, digits):,.0f}"
    if abs(x) < 1e-3:
        return f"{x:.2e}"
    short = f"{x:.3g}"  # trailing zeros only where rounding made them (4.9956 -> 5.00; 0.4 stays 0.4)
    return short if math.isclose(float(short), x, rel_tol=1e-9) else f"{x:#.3g}".rstrip(".")


def ms(x: Any) -> str:
    """Milliseconds as an integer."""
    return "n/a" if x is None else f"{round(x):,}"


def s_to_ms(x: Any) -> str:
    return "n/a" if x is None else ms(x * 1000)


def pct(x: Any) -> str:
    """A share (0..1) as a percentage, three significant figures."""
    return "n/a" if x is None else f"{num(float(x) * 100)} %"


def pp(x: Any) -> str:
    """A difference of shares as signed percentage points."""
    return "n/a" if x is None else f"{'+' if x > 0 else ''}{num(float(x) * 100)} pp"


def signed(x: Any) -> str:
    return "n/a" if x is None else f"{'+' if x > 0 else ''}{num(float(x))}"


def gib(x: Any) -> str:
    return "n/a" if x is None else f"{num(x / 2**30)} GiB"


def interval(low: Any, high: Any, fmt: Fmt = num) -> str:
    """`[low, high]` as recorded, or the words saying none was."""
    if low is None or high is None:
        return NO_INTERVAL
    return f"[{fmt(low)}, {fmt(high)}]"


def pair(values: Sequence[Any] | None, fmt: Fmt = num) -> str:
    """An interval recorded as a two-element list (or null)."""
    return interval(*(values or (None, None)), fmt=fmt)


def cell(value: Any) -> str:
    text = value if isinstance(value, str) else num(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A Markdown table; cells already formatted (a non-string is formatted with `num`)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def details(title: str, body: str, kind: str = "note") -> str:
    """A collapsed pymdownx.details block."""
    indented = "\n".join(("    " + line) if line else "" for line in body.splitlines())
    return f'??? {kind} "{title}"\n\n{indented}'


def code(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return "`" + text.replace("`", "'") + "`"


def plain(value: Any) -> str:
    """A settings value for a table cell: scalars formatted, lists and dicts as compact JSON."""
    if isinstance(value, (dict, list)):
        return code(value)
    return code(value) if isinstance(value, str) else num(value)


def mapping(d: dict[str, Any], headers: Sequence[str] = ("setting", "value")) -> str:
    return table(headers, [(code(k), plain(v)) for k, v in d.items()])


Column = tuple[str, str, Fmt]  # header, key in the row, format


def columns(rows: Iterable[dict[str, Any]], spec: Sequence[Column]) -> str:
    """A table of dict rows, one column per (header, key, format); a key the row lacks shows `n/a`."""
    return table([h for h, _, _ in spec], [[fmt(row.get(key)) for _, key, fmt in spec] for row in rows])


def text(x: Any) -> str:
    return "n/a" if x is None else str(x)
