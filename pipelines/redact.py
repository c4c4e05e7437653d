"""PII redaction with typed tokens (<EMAIL>, <CARD>, ...), applied to free text and to tool arguments alike.

Card numbers are only redacted when they pass the Luhn check, so order ids and other long
numbers survive. The same function runs in Spark prep, in the quality gate's independent
regex check (patterns), and in the serving client, so training and serving see the same text.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from pipelines.logs.luhn import luhn_valid

PII_TYPES = ("EMAIL", "CARD", "PHONE", "ADDRESS")

EMAIL_RE = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
CARD_RE = re.compile(r"(?<![\w-])(?:\d[ -]?){12,18}\d(?![\w-])")
PHONE_RE = re.compile(r"(?<![\w-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{3}\)|\d{2,4})[ .-]\d{3,4}[ .-]\d{4}(?![\w-])")
STREET_TYPES = (
    "Street|St|Avenue|Ave|Road|Rd|Drive|Dr|Lane|Ln|Boulevard|Blvd|Court|Ct|Way|Place|Pl|Terrace|Parkway|Square"
)
ADDRESS_RE = re.compile(
    rf"\b\d{{1,5}} (?:[A-Z][a-z]+ ){{1,3}}(?:{STREET_TYPES})\b\.?(?:,? [A-Z][a-z]+(?: [A-Z][a-z]+)?)?"
)

# Java-regex versions for the Great Expectations gate (no Luhn there: any 16-digit card shape).
GATE_PATTERNS = {
    "EMAIL": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "CARD": r"(^|[^0-9A-Za-z-])([0-9][ -]?){15}[0-9]($|[^0-9A-Za-z-])",
    "PHONE": r"(^|[^0-9A-Za-z-])(\+[0-9]{1,3}[ .-]?)?(\([0-9]{3}\)|[0-9]{3}) ?[.-]?[0-9]{3}[ .-][0-9]{4}"
    r"($|[^0-9A-Za-z-])",
    "ADDRESS": rf"[0-9]{{1,5}} ([A-Z][a-z]+ ){{1,3}}({STREET_TYPES})[^A-Za-z]",
}


def is_card(text: str) -> bool:
    """Whether a `CARD_RE` match is a card number: 13 to 19 digits that pass the Luhn check."""
    digits = re.sub(r"\D", "", text)
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _card(match: re.Match[str], counts: Counter[str]) -> str:
    if is_card(match.group(0)):
        counts["CARD"] += 1
        return "<CARD>"
    return match.group(0)


def redact_text(text: str, counts: Counter[str] | None = None) -> str:
    """Replace PII in `text` by <EMAIL>, <CARD>, <PHONE>, <ADDRESS>; count replacements in `counts`."""
    if counts is None:
        counts = Counter()
    if not text:
        return text
    text, n = EMAIL_RE.subn("<EMAIL>", text)
    counts["EMAIL"] += n
    if any(c.isdigit() for c in text):
        text = CARD_RE.sub(lambda m: _card(m, counts), text)
        text, n = PHONE_RE.subn("<PHONE>", text)
        counts["PHONE"] += n
        text, n = ADDRESS_RE.subn("<ADDRESS>", text)
        counts["ADDRESS"] += n
    return text


def redact_value(value: Any, counts: Counter[str]) -> Any:
    """Redact every string inside a JSON value (tool arguments), keeping its structure."""
    if isinstance(value, str):
        return redact_text(value, counts)
    if isinstance(value, list):
        return [redact_value(v, counts) for v in value]
    if isinstance(value, dict):
        return {k: redact_value(v, counts) for k, v in value.items()}
    return value
