"""JSON on the HTTP API's wire: a request body read strictly, the ``Idempotency-Key``
header read as exactly one key, and answers written with sorted keys.

A body is read only when it is sent as JSON (415 otherwise), at most ``MAX_BODY_BYTES``
of it (413), and only as JSON itself defines it (RFC 8259): no ``NaN`` or ``Infinity``,
no number too large for a double, no object naming a member twice. ``Idempotency-Key``
is one header line with one key, bare or in the structured-field string form (``"abc"``,
the IETF draft's own form), both meaning the same key.
"""

import json
import math
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from onceflow.errors import (
    InvalidRequest,
    MalformedIdempotencyKey,
    RequestTooLarge,
    UnsupportedMediaType,
)

MAX_BODY_BYTES = 256 * 1024
"""Largest request body read; larger ones are refused before parsing."""


_SORTED = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)
"""What ``json.dumps`` with these options builds on every call, built once."""


class SortedJSONResponse(JSONResponse):
    """JSON with sorted keys, so a body read back from ``jsonb`` is byte-for-byte the same."""

    def render(self, content: Any) -> bytes:
        return _SORTED.encode(content).encode()


def sent_key(request: Request) -> str | None:
    """The ``Idempotency-Key`` the request carries, bare; None without one.

    Raises:
        MalformedIdempotencyKey: The header is repeated, holds a list, or is a malformed
            structured-field string (the key's own alphabet is the service's check).
    """
    lines = request.headers.getlist("idempotency-key")
    if not lines:
        return None
    if len(lines) > 1:
        raise MalformedIdempotencyKey(_ONE_KEY)
    value = lines[0]
    if value.startswith('"'):
        return _sf_string(value)
    if "," in value:
        raise MalformedIdempotencyKey(_ONE_KEY)
    return value


_ONE_KEY = (
    "send exactly one Idempotency-Key: one header line with one key (a repeated header "
    "or a list is ambiguous about which attempt this is)"
)


def _sf_string(value: str) -> str:
    """The content of an RFC 8941 sf-string that is the whole of ``value``."""
    content: list[str] = []
    escaped = False
    for position, char in enumerate(value[1:], start=1):
        if escaped:
            if char not in '"\\':
                break
            content.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            if position != len(value) - 1:
                # Parameters, or a list of keys: neither is one key.
                raise MalformedIdempotencyKey(_ONE_KEY)
            if not content:
                break
            return "".join(content)
        elif not " " <= char <= "~":
            break
        else:
            content.append(char)
    raise MalformedIdempotencyKey(
        'a quoted Idempotency-Key must be one structured-field string ("abc") holding the key'
    )


async def read_json(request: Request) -> Any:
    """The request's body as the JSON value it holds.

    Raises:
        UnsupportedMediaType: The body is not sent as JSON in UTF-8.
        RequestTooLarge: It is larger than ``MAX_BODY_BYTES``.
        InvalidRequest: It is empty, not JSON, or JSON that parsers read differently.
    """
    return parse_json(await read_body(request))


async def read_body(request: Request) -> bytes:
    """The request's body as sent, once it is known to be a JSON body of a size the
    gateway reads (``read_json`` without the parse).

    Raises:
        UnsupportedMediaType: The body is not sent as JSON in UTF-8.
        RequestTooLarge: It is larger than ``MAX_BODY_BYTES``.
        InvalidRequest: It is empty.
    """
    declared_types = request.headers.getlist("content-type")
    if declared_types and not _is_json(declared_types):
        raise UnsupportedMediaType(_JSON_ONLY)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestTooLarge(f"the body may be at most {MAX_BODY_BYTES} bytes")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise RequestTooLarge(f"the body may be at most {MAX_BODY_BYTES} bytes")
    if not raw.strip():
        raise InvalidRequest(
            "the body must be a JSON document", errors=[{"loc": [], "msg": "empty body"}]
        )
    if not declared_types:
        # A body that does not say what it is is not taken for JSON.
        raise UnsupportedMediaType(_JSON_ONLY)
    return bytes(raw)


def parse_json(raw: bytes) -> Any:
    """The JSON value a body read by ``read_body`` holds.

    Raises:
        InvalidRequest: It is not JSON, or JSON that parsers read differently.
    """
    try:
        # What ``json.loads`` does with bytes, with a decoder built once.
        return _STRICT.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = getattr(error, "msg", None) or "not UTF-8"
        raise InvalidRequest(
            "the body is not valid JSON", errors=[{"loc": [], "msg": str(reason)}]
        ) from None
    except _NotStrictJson as error:
        raise InvalidRequest(
            "the body is not valid JSON", errors=[{"loc": [], "msg": str(error)}]
        ) from None
    except RecursionError:
        raise InvalidRequest(
            "the body is nested too deeply", errors=[{"loc": [], "msg": "too deep"}]
        ) from None


_JSON_ONLY = (
    "the body must be sent as JSON: Content-Type: application/json (or a +json type), in UTF-8"
)


def _is_json(declared_types: list[str]) -> bool:
    """Whether the one ``Content-Type`` sent is JSON (``application/json`` or a
    ``+json`` type) in UTF-8, the only encoding JSON has (RFC 8259)."""
    if len(declared_types) != 1:
        return False
    media_type, *parameters = (part.strip() for part in declared_types[0].split(";"))
    media_type = media_type.lower()
    if not (
        media_type == "application/json"
        or (media_type.startswith("application/") and media_type.endswith("+json"))
    ):
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() != "utf-8":
            return False
    return True


class _NotStrictJson(ValueError):
    """What Python's parser takes but JSON (RFC 8259) does not, or leaves ambiguous."""


def _not_json(constant: str) -> Any:
    raise _NotStrictJson(f"{constant} is not a JSON value")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise _NotStrictJson("a number too large for a double")
    return number


def _object_without_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Parsers disagree on which of two equal names wins; a proxy could check one value
    # and the gateway act on the other.
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise _NotStrictJson("an object names the same member twice")
    return dict(pairs)


_STRICT = json.JSONDecoder(
    parse_constant=_not_json,
    parse_float=_finite_float,
    object_pairs_hook=_object_without_repeats,
)
"""JSON as RFC 8259 defines it (``read_json``), built once: ``json.loads`` with hooks
builds a decoder on every call."""
