"""The request fingerprint: a versioned hash of every input that changes what a call does.

Two requests with the same key are the same logical attempt only when their
fingerprints match. The version prefix lets the canonical form change later without
old records matching new requests by accident.
"""

import hashlib
import json
from typing import Any

FINGERPRINT_VERSION = "v1"
API_VERSION = "1"
"""Version of the HTTP/MCP contract; part of every fingerprint."""
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
"""The canonical form's encoder, built once (``json.dumps`` with options builds one per
call)."""


def request_fingerprint(
    *, operation: str, scope: str, route: str, body: Any, api_version: str = API_VERSION
) -> str:
    """``v1:`` + sha256 of the canonical JSON of the behaviour-affecting inputs.

    Args:
        operation: What the request does (``tools.call``, ``tasks.create``).
        scope: The authenticated scope the key lives in (tenant, principal, target).
        route: The route template and its path values (e.g. ``POST /v1/tools/issue_coupon/calls``).
        body: The body after validation and defaults, as JSON-compatible data.
        api_version: The contract version the request was made under.
    """
    canonical = _CANONICAL.encode(
        {
            "api_version": api_version,
            "operation": operation,
            "scope": scope,
            "route": route,
            "body": body,
        }
    )
    return f"{FINGERPRINT_VERSION}:{hashlib.sha256(canonical.encode()).hexdigest()}"
