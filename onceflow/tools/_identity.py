"""Stable identities: derived child keys, task workflow ids and digests for logs.

A child key is the downstream identity of one child operation. It is derived from the
full local operation identity and never from the raw client key, the attempt number or
the Temporal run id (the run id changes on workflow retry and continue-as-new).
"""

import hashlib
import json
import re
from typing import Any

from onceflow.errors import MalformedIdempotencyKey

CHILD_KEY_VERSION = "v1"
IDEMPOTENCY_KEY_MAX_LENGTH = 200
IDEMPOTENCY_KEY_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]*"
"""The alphabet of an idempotency key, unanchored (the boundary's schemas anchor it):
letters, digits and ``. _ : -``, starting with a letter or digit."""
_IDEMPOTENCY_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)


def check_idempotency_key(raw_key: str) -> str:
    """Return the key if it is well formed; raise ``MalformedIdempotencyKey`` otherwise.

    The message never repeats the key: it may be a secret pasted by mistake.
    """
    if not raw_key:
        raise MalformedIdempotencyKey("the idempotency key is missing")
    if len(raw_key) > IDEMPOTENCY_KEY_MAX_LENGTH:
        raise MalformedIdempotencyKey(
            f"the idempotency key is longer than {IDEMPOTENCY_KEY_MAX_LENGTH} characters"
        )
    if not _IDEMPOTENCY_KEY.fullmatch(raw_key):
        raise MalformedIdempotencyKey(
            "the idempotency key may hold only letters, digits and . _ : - "
            "and must start with a letter or digit"
        )
    return raw_key


def _length_prefixed_digest(*parts: str) -> str:
    # Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    hasher = hashlib.sha256()
    for part in parts:
        encoded = part.encode()
        hasher.update(len(encoded).to_bytes(4, "big"))
        hasher.update(encoded)
    return hasher.hexdigest()


def derive_child_key(
    *,
    tenant: str,
    workflow_id: str,
    step_id: str,
    child_op: str,
    provider_account: str,
    generation: int = 1,
) -> str:
    """The idempotency key for one child operation at one provider account.

    Args:
        tenant: Tenant owning the task.
        workflow_id: The task's workflow id (stable across runs).
        step_id: The step inside the task.
        child_op: Which child effect of the step (e.g. ``charge``, ``refund``).
        provider_account: The provider account the effect lands in.
        generation: The step's key generation: 1 unless an operator authorised a new
            attempt after the old key became unusable (the provider may have forgotten
            it, or it holds a stored failure). Default 1.
    """
    if generation < 1:
        raise ValueError(f"a key generation counts from 1, not {generation}")
    parts = [CHILD_KEY_VERSION, tenant, workflow_id, step_id, child_op, provider_account]
    if generation > 1:  # generation 1 keeps the keys derived before generations existed
        parts.append(f"generation:{generation}")
    digest = _length_prefixed_digest(*parts)
    return f"of{CHILD_KEY_VERSION}_{digest[:48]}"


def derive_task_workflow_id(*, tenant: str, scope: str, idempotency_key: str) -> str:
    """The workflow id of the task started by one client key in one scope."""
    digest = _length_prefixed_digest("task", tenant, scope, idempotency_key)
    return f"{scope}-{digest[:32]}"


def key_digest(raw_key: str) -> str:
    """A short digest of a key, safe to log and trace in place of the key itself."""
    return "sha256:" + hashlib.sha256(raw_key.encode()).hexdigest()[:16]


def arguments_digest(tool: str, arguments: dict[str, Any]) -> str:
    """The digest an approval is bound to: the tool and its exact, canonical arguments."""
    canonical = json.dumps(
        {"tool": tool, "arguments": arguments}, sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
