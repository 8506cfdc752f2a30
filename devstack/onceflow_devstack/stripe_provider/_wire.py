"""Stripe's wire format for the subset the provider speaks.

Owns everything a real Stripe client can observe on the wire apart from behaviour:
decoding form-encoded bracket parameters (``metadata[k]=v``, ``expand[0]=x``,
``expand[]=x``), object ids and request ids, the error envelope
``{"error": {"type", "code", "message", "param", "decline_code"}}``, the list
parameters (``limit``, ``starting_after``, ``ending_before``, ``created[gte]``) and the
search query language (``metadata['key']:'value' AND status:'succeeded'``).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

JsonObject = dict[str, Any]
"""A decoded JSON object or decoded form body; values are str, list or dict."""

_ID_ALPHABET = string.ascii_letters + string.digits
_KEY_PATTERN = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")


def new_id(prefix: str, length: int = 24) -> str:
    """Return a Stripe-shaped object id such as ``pi_3Pq...``.

    Args:
        prefix: The object prefix without the underscore (``pi``, ``re``, ``req``).
        length: Number of random base62 characters after the prefix.
    """
    return prefix + "_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(length))


def decode_form(raw: str) -> JsonObject:
    """Decode a form-encoded body or query string with Stripe's bracket nesting.

    ``a[b]=1`` becomes ``{"a": {"b": "1"}}``; ``a[0]=x`` and ``a[]=x`` become lists.

    Args:
        raw: The urlencoded text.

    Returns:
        The nested parameters; every leaf is a string.

    Raises:
        StripeApiError: A key is malformed.
    """
    root: JsonObject = {}
    for key, value in parse_qsl(raw, keep_blank_values=True):
        match = _KEY_PATTERN.match(key)
        if match is None:
            raise invalid_request(f"Invalid parameter name: {key}", param=key)
        path = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))]
        node: dict[str, Any] = root
        for segment in path[:-1]:
            child = node.setdefault(segment or str(len(node)), {})
            if not isinstance(child, dict):
                raise invalid_request(f"Invalid parameter nesting: {key}", param=key)
            node = child
        node[path[-1] or str(len(node))] = value
    return _lists_from_index_maps(root)


def _lists_from_index_maps(node: JsonObject) -> JsonObject:
    for name, value in node.items():
        if isinstance(value, dict):
            value = _lists_from_index_maps(value)
            if value and all(k.isdigit() for k in value):
                value = [value[k] for k in sorted(value, key=int)]
            node[name] = value
    return node


def fingerprint_request(method: str, path: str, params: JsonObject) -> str:
    """Return a digest of everything that makes two requests "the same parameters".

    Args:
        method: HTTP method.
        path: Request path, which pins the endpoint and the object acted on.
        params: The decoded parameters.
    """
    canonical = json.dumps([method, path, params], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


class StripeApiError(Exception):
    """An API error in Stripe's envelope, carried up to the HTTP layer."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        decline_code: str | None = None,
        extra: JsonObject | None = None,
    ) -> None:
        """Build the error.

        Args:
            status: HTTP status (400, 401, 402, 404, 409, 429, 500, 503).
            error_type: Stripe's ``type`` (``card_error``, ``invalid_request_error`` ...).
            message: Human-readable message.
            code: Stripe's machine-readable ``code``.
            param: The parameter at fault.
            decline_code: The issuer's decline reason for card errors.
            extra: Further members of the error object (e.g. ``payment_intent``).
        """
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.code = code
        self.param = param
        self.decline_code = decline_code
        self.extra = extra or {}

    def body(self) -> JsonObject:
        """Return the JSON body Stripe would send for this error."""
        error: JsonObject = {"type": self.error_type, "message": self.message}
        for name in ("code", "param", "decline_code"):
            if getattr(self, name) is not None:
                error[name] = getattr(self, name)
        if self.code is not None:
            error["doc_url"] = f"https://stripe.com/docs/error-codes/{self.code.replace('_', '-')}"
        return {"error": {**error, **self.extra}}


def invalid_request(
    message: str, *, param: str | None = None, code: str | None = None, status: int = 400
) -> StripeApiError:
    """Return an ``invalid_request_error`` (400 unless told otherwise)."""
    return StripeApiError(status, "invalid_request_error", message, code=code, param=param)


def resource_missing(kind: str, object_id: str, param: str = "id") -> StripeApiError:
    """Return Stripe's ``resource_missing`` error for an unknown object id.

    Args:
        kind: Human name of the object (``payment_intent``, ``PaymentMethod``).
        object_id: The id that was not found.
        param: ``id`` for an id in the URL (404); otherwise the body parameter (400).
    """
    return invalid_request(
        f"No such {kind}: '{object_id}'",
        param=param,
        code="resource_missing",
        status=404 if param == "id" else 400,
    )


def param_str(params: JsonObject, name: str, *, required: bool = False) -> str | None:
    """Read a scalar string parameter.

    Raises:
        StripeApiError: It is missing but required, or it is not a scalar.
    """
    value = params.get(name)
    if value is None or value == "":
        if required:
            raise invalid_request(
                f"Missing required param: {name}.", param=name, code="parameter_missing"
            )
        return None
    if not isinstance(value, str):
        raise invalid_request(
            f"Invalid string: {name}", param=name, code="parameter_invalid_string"
        )
    return value


def param_amount(params: JsonObject, name: str = "amount", *, required: bool = True) -> int | None:
    """Read a positive integer amount in the smallest currency unit.

    Raises:
        StripeApiError: Missing (when required), not an integer, or below 1.
    """
    raw = param_str(params, name, required=required)
    if raw is None:
        return None
    if not re.fullmatch(r"-?\d+", raw):
        raise invalid_request(
            f"Invalid integer: {raw}", param=name, code="parameter_invalid_integer"
        )
    if int(raw) < 1:
        raise invalid_request(
            "This value must be greater than or equal to 1.", param=name, code="amount_too_small"
        )
    return int(raw)


def param_bool(params: JsonObject, name: str) -> bool:
    """Read a boolean flag sent as ``true``/``false``; absent means false."""
    raw = param_str(params, name)
    if raw not in (None, "true", "false"):
        raise invalid_request(
            f"Invalid boolean: {raw}", param=name, code="parameter_invalid_boolean"
        )
    return raw == "true"


def param_metadata(params: JsonObject) -> dict[str, str]:
    """Read ``metadata[...]``; an empty value unsets a key, as in Stripe."""
    raw = params.get("metadata", {})
    if raw == "":
        return {}
    if not isinstance(raw, dict) or not all(isinstance(v, str) for v in raw.values()):
        raise invalid_request("Invalid metadata: expected a hash of strings.", param="metadata")
    return {k: v for k, v in raw.items() if v != ""}


def param_expand(params: JsonObject) -> list[str]:
    """Read ``expand[]`` as a list of field names."""
    raw = params.get("expand", [])
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list) or not all(isinstance(v, str) for v in raw):
        raise invalid_request("Invalid array: expand", param="expand")
    return list(raw)


_MAX_LIST_LIMIT = 100
_CREATED_BOUNDS = ("gt", "gte", "lt", "lte")


@dataclass(frozen=True)
class PageRequest:
    """Which page of a list endpoint a request asks for.

    Attributes:
        limit: How many objects at most, 1 to 100.
        starting_after: Return the objects listed after (older than) this id.
        ending_before: Return the objects listed before (newer than) this id.
    """

    limit: int = 10
    starting_after: str | None = None
    ending_before: str | None = None


def param_page(params: JsonObject) -> PageRequest:
    """Read a list endpoint's ``limit``, ``starting_after`` and ``ending_before``.

    Raises:
        StripeApiError: ``limit`` is not an integer from 1 to 100, or both cursors are
            given (Stripe's cursors are mutually exclusive).
    """
    raw_limit = param_str(params, "limit")
    limit = 10
    if raw_limit is not None:
        if not re.fullmatch(r"-?[0-9]+", raw_limit):
            raise invalid_request(
                f"Invalid integer: {raw_limit}", param="limit", code="parameter_invalid_integer"
            )
        limit = int(raw_limit)
        if limit < 1:
            raise invalid_request("This value must be greater than or equal to 1.", param="limit")
        if limit > _MAX_LIST_LIMIT:
            raise invalid_request(
                f"This value must be less than or equal to {_MAX_LIST_LIMIT}.", param="limit"
            )
    starting_after = param_str(params, "starting_after")
    ending_before = param_str(params, "ending_before")
    if starting_after is not None and ending_before is not None:
        raise invalid_request(
            "You may only specify one of these parameters: ending_before, starting_after.",
            param="ending_before",
        )
    return PageRequest(limit, starting_after, ending_before)


@dataclass(frozen=True)
class CreatedRange:
    """The ``created`` filter of a list endpoint; an unset bound does not restrict.

    Attributes:
        gt: Created strictly after this Unix second.
        gte: Created at or after this Unix second.
        lt: Created strictly before this Unix second.
        lte: Created at or before this Unix second.
    """

    gt: int | None = None
    gte: int | None = None
    lt: int | None = None
    lte: int | None = None

    def contains(self, created: int) -> bool:
        """Return whether an object's ``created`` satisfies every bound."""
        return (
            (self.gt is None or created > self.gt)
            and (self.gte is None or created >= self.gte)
            and (self.lt is None or created < self.lt)
            and (self.lte is None or created <= self.lte)
        )


def param_created(params: JsonObject) -> CreatedRange:
    """Read ``created`` as ``created[gte|gt|lte|lt]=<unix>``, or ``created=<unix>`` (equal).

    Raises:
        StripeApiError: An unknown bound, or a bound that is not a Unix second.
    """
    raw = params.get("created")
    if raw is None or raw == "":
        return CreatedRange()
    if isinstance(raw, str):
        second = _unix_second(raw, "created")
        return CreatedRange(gte=second, lte=second)
    if not isinstance(raw, dict):
        raise invalid_request("Invalid created: expected an integer or a hash.", param="created")
    unknown = sorted(set(raw) - set(_CREATED_BOUNDS))
    if unknown:
        raise invalid_request(
            f"Received unknown parameter: created[{unknown[0]}]", param=f"created[{unknown[0]}]"
        )
    bounds = {name: _unix_second(value, f"created[{name}]") for name, value in raw.items()}
    return CreatedRange(**bounds)


def _unix_second(raw: object, param: str) -> int:
    if not isinstance(raw, str) or not re.fullmatch(r"[0-9]+", raw):
        raise invalid_request(
            f"Invalid integer: {raw}", param=param, code="parameter_invalid_integer"
        )
    return int(raw)


@dataclass(frozen=True)
class SearchClause:
    """One ``field:value`` term of a search query.

    Attributes:
        field: Top-level field name, or ``metadata``.
        value: The value the field must equal (compared as text).
        metadata_key: The key inside ``metadata`` when ``field`` is ``metadata``.
    """

    field: str
    value: str
    metadata_key: str | None = None

    def matches(self, obj: JsonObject) -> bool:
        """Return whether a Stripe object satisfies this term."""
        if self.metadata_key is not None:
            return bool(obj.get("metadata", {}).get(self.metadata_key) == self.value)
        return str(obj.get(self.field)) == self.value


@dataclass(frozen=True)
class SearchQuery:
    """A conjunction of :class:`SearchClause` terms (Stripe's ``AND``)."""

    clauses: tuple[SearchClause, ...] = field(default=())

    def matches(self, obj: JsonObject) -> bool:
        """Return whether every clause holds for ``obj``."""
        return all(clause.matches(obj) for clause in self.clauses)


_CLAUSE = re.compile(
    r"""\s*(?:metadata\[(?P<kq>['"])(?P<key>.*?)(?P=kq)\]|(?P<field>[a-z_]+))\s*:\s*"""
    r"""(?:(?P<vq>['"])(?P<quoted>.*?)(?P=vq)|(?P<bare>[^\s'"]+))\s*"""
)


def parse_search_query(query: str, searchable: frozenset[str]) -> SearchQuery:
    """Parse the exact-match, ``AND``-only part of Stripe's search query language.

    Args:
        query: E.g. ``metadata['operation_id']:'op_1' AND status:'succeeded'``.
        searchable: Top-level fields that may appear besides ``metadata``.

    Raises:
        StripeApiError: The query uses syntax this provider does not implement.
    """
    clauses: list[SearchClause] = []
    position = 0
    while True:
        match = _CLAUSE.match(query, position)
        if match is None or (match.group("field") and match.group("field") not in searchable):
            raise invalid_request(
                f"Unsupported search query near position {position}: {query!r}", param="query"
            )
        value = match.group("quoted") if match.group("vq") else match.group("bare")
        field_name = "metadata" if match.group("key") is not None else match.group("field")
        clauses.append(SearchClause(field_name, value, match.group("key")))
        position = match.end()
        if position == len(query):
            return SearchQuery(tuple(clauses))
        if not query.startswith("AND", position):
            raise invalid_request(
                f"Only AND-combined exact matches are supported: {query!r}", param="query"
            )
        position += len("AND")
