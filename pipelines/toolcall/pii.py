"""A redaction token never reaches a caller.

Training targets carry prep's redaction tokens where the logs had PII (`<EMAIL>`, `<CARD>`, `<PHONE>`,
`<ADDRESS>`), so a tuned model may answer `{"recipient_email":"<EMAIL>"}` although the caller wrote the
address. Before an answer leaves the gateway each token in its arguments is replaced by the one value of
its kind the customer's own turns state (found with prep's own patterns; never a tool result, which may name
another person);
where the conversation states none, or several different ones, the call is not passed on: the caller gets
a plain message asking for the value instead (and the turn is never a training label).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pipelines.redact import ADDRESS_RE, CARD_RE, EMAIL_RE, PHONE_RE, is_card

TOKEN_RE = re.compile(r"<(EMAIL|CARD|PHONE|ADDRESS)>")
WORDS = {"EMAIL": "email address", "CARD": "card number", "PHONE": "phone number", "ADDRESS": "address"}


def _cards(text: str) -> list[str]:
    """Card numbers as prep counts them (`prep.redact.is_card`: Luhn-valid, 13 to 19 digits)."""
    return [m.group(0) for m in CARD_RE.finditer(text) if is_card(m.group(0))]


def stated_values(texts: Iterable[str]) -> dict[str, list[str]]:
    """Each PII kind's distinct values in the conversation, in order of appearance."""
    found: dict[str, list[str]] = {kind: [] for kind in WORDS}
    for text in texts:
        if not isinstance(text, str) or not text:
            continue
        for kind, values in (
            ("EMAIL", EMAIL_RE.findall(text)),
            ("CARD", _cards(text)),
            ("PHONE", [m.group(0) for m in PHONE_RE.finditer(text)]),
            ("ADDRESS", [m.group(0).rstrip(".") for m in ADDRESS_RE.finditer(text)]),
        ):
            for v in values:
                if v not in found[kind]:
                    found[kind].append(v)
    return found


def restore(arguments: str, texts: Iterable[str]) -> tuple[str | None, list[str]]:
    """(the arguments JSON with every redaction token replaced by the value it stands for, the kinds that
    could not be: none or several candidates). Arguments without a token come back unchanged."""
    if not TOKEN_RE.search(arguments):
        return arguments, []
    values = stated_values(texts)
    missing: list[str] = []

    def fill(match: re.Match[str]) -> str:
        candidates = values[match.group(1)]
        if len(candidates) == 1:
            return candidates[0]
        missing.append(match.group(1))
        return match.group(0)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return TOKEN_RE.sub(fill, value)
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: walk(v) for k, v in value.items()}
        return value

    try:
        restored = walk(json.loads(arguments))
    except json.JSONDecodeError:
        return None, sorted(set(TOKEN_RE.findall(arguments)))
    if missing:
        return None, sorted(set(missing))
    return json.dumps(restored, separators=(",", ":"), ensure_ascii=False), []


def ask_for(kinds: list[str]) -> str:
    """The message a caller gets instead of a call that would carry a redaction token."""
    what = " and ".join(WORDS[k] for k in kinds)
    return f"I need the customer's {what} to do that: the conversation does not state exactly one."


def pass_on(arguments: str, stated: Iterable[str]) -> tuple[str, bool]:
    """What the caller gets for a call with these arguments: (the arguments with every redaction token filled
    from `stated`, True), or (the text asking for the values, False) where it cannot be passed on. The gateway
    and the episodes (`evaluate.episodes.as_passed_on`) both decide with this."""
    restored, missing = restore(arguments, stated)
    if restored is None:
        return ask_for(missing), False
    return restored, True
