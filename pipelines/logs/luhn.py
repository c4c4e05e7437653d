"""The Luhn checksum of payment card numbers: the generator makes valid ones, the redactor finds them."""

from __future__ import annotations


def luhn_complete(digits: str) -> str:
    """Append the Luhn check digit to a string of digits."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d * 2 > 9 else d * 2
        total += d
    return digits + str((10 - total % 10) % 10)


def luhn_valid(number: str) -> bool:
    """True for 12+ digit numbers (separators ignored) whose last digit is their Luhn check digit."""
    digits = "".join(c for c in number if c.isdigit())
    return len(digits) >= 12 and luhn_complete(digits[:-1]) == digits
