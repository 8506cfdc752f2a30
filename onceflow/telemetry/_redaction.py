"""Finds what must never leave a process in a log line, a span or a task's history.

Card numbers are recognised as 13 to 19 digits (spaces or dashes between groups allowed)
that pass the Luhn check; secrets by the shapes of the keys onceflow handles (Stripe
secret and restricted keys, onceflow API keys, bearer credentials). Idempotency keys
have no shape to recognise: they are kept out by construction (only ``key_digest`` of a
key is ever written), and the tests plant one to prove it.
"""

import re
from collections.abc import Iterator
from typing import Any

_CARD_CANDIDATE = re.compile(r"(?<![0-9])[0-9](?:[ -]?[0-9]){12,18}(?![0-9])")
_SECRETS = re.compile(
    r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9_]{6,}"  # Stripe secret and restricted keys
    r"|\bofk_[A-Za-z0-9_-]{8,}"  # onceflow API keys (gateway/_principals.py)
    # A bearer credential: long and with a digit, so "bearer instruments" is prose.
    r"|\bBearer\s+(?=[A-Za-z0-9._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{16,}"
)
CARD_NUMBER_REMOVED = "[card number removed]"
SECRET_REMOVED = "[secret removed]"


def _passes_luhn(digits: str) -> bool:
    total = 0
    for position, char in enumerate(reversed(digits)):
        digit = int(char)
        if position % 2:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


def _card_numbers(text: str) -> Iterator[re.Match[str]]:
    for match in _CARD_CANDIDATE.finditer(text):
        digits = re.sub(r"[ -]", "", match.group())
        if 13 <= len(digits) <= 19 and _passes_luhn(digits):
            yield match


def looks_like_card_number(text: str) -> bool:
    """Whether ``text`` contains a Luhn-valid card number."""
    return next(_card_numbers(text), None) is not None


def looks_like_secret(text: str) -> bool:
    """Whether ``text`` contains a recognisable API key or bearer credential."""
    return _SECRETS.search(text) is not None


def sensitive_locations(
    value: Any, location: tuple[str | int, ...] = ()
) -> list[tuple[list[str | int], str]]:
    """Where in a JSON-like value a string holds a card number or a secret, and which.

    Only locations and kinds are returned, never the values.
    """
    if isinstance(value, str):
        if looks_like_card_number(value):
            return [(list(location), "card number")]
        return [(list(location), "secret")] if looks_like_secret(value) else []
    if isinstance(value, dict):
        return [
            found
            for key, item in value.items()
            for found in sensitive_locations(item, (*location, str(key)))
        ]
    if isinstance(value, list | tuple):
        return [
            found
            for index, item in enumerate(value)
            for found in sensitive_locations(item, (*location, index))
        ]
    return []


def scrub(text: str) -> str:
    """``text`` with card numbers and recognisable secrets replaced by a marker."""
    for match in reversed(list(_card_numbers(text))):
        text = text[: match.start()] + CARD_NUMBER_REMOVED + text[match.end() :]
    return _SECRETS.sub(SECRET_REMOVED, text)
