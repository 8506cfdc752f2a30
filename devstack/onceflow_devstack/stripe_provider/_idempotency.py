"""Stripe's idempotency rules, keyed by ``(api key, Idempotency-Key)``.

A record moves through one small state machine::

    (absent) --claim--> IN_FLIGHT --complete--> COMPLETED --retention passes--> (absent)
                            |
                            +--release--> (absent)   # nothing started executing

For a claim on an existing key the store answers:

    COMPLETED, same fingerprint       -> REPLAY      (stored status + body, replayed exactly)
    COMPLETED or IN_FLIGHT, other fp  -> MISMATCH    (400 idempotency_error)
    IN_FLIGHT, same fingerprint       -> IN_FLIGHT   (409 idempotency_key_in_use)

Completed records, including stored 500s, are kept for ``retention_seconds`` after the
first request; in-flight records are never pruned.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

Scope = tuple[str, str]
"""``(api key, Idempotency-Key)``: keys are per account, as at Stripe."""


@dataclass(frozen=True)
class StoredResponse:
    """The response saved under a key.

    Attributes:
        status: HTTP status.
        body: The exact response body bytes.
        request_id: The request that produced it (sent back as ``Original-Request``).
    """

    status: int
    body: bytes
    request_id: str


class ClaimOutcome(enum.StrEnum):
    """What :meth:`IdempotencyStore.claim` decided."""

    CLAIMED = "claimed"
    REPLAY = "replay"
    IN_FLIGHT = "in_flight"
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class Claim:
    """Result of a claim: the outcome and, for ``REPLAY``, the stored response."""

    outcome: ClaimOutcome
    stored: StoredResponse | None = None


@dataclass
class _Record:
    fingerprint: str
    first_seen_at: float
    response: StoredResponse | None = None


class IdempotencyStore:
    """Keys, their fingerprints and stored responses, with time-based pruning."""

    def __init__(self, retention_seconds: float) -> None:
        """Create an empty store.

        Args:
            retention_seconds: How long a completed key is honoured after its first
                request. Stripe keeps keys for about 24 hours.
        """
        self.retention_seconds = retention_seconds
        self._records: dict[Scope, _Record] = {}
        # Claims are check-then-set; the lock keeps them atomic even if a later change
        # adds an await between the check and the set.
        self._lock = asyncio.Lock()

    async def claim(self, scope: Scope, fingerprint: str, now: float) -> Claim:
        """Claim a key for a request, or report why it cannot run.

        Args:
            scope: ``(api key, Idempotency-Key)``.
            fingerprint: Digest of method, path and parameters.
            now: Current Unix time.
        """
        async with self._lock:
            self.prune(now)
            record = self._records.get(scope)
            if record is None:
                self._records[scope] = _Record(fingerprint, now)
                return Claim(ClaimOutcome.CLAIMED)
            if record.fingerprint != fingerprint:
                return Claim(ClaimOutcome.MISMATCH)
            if record.response is None:
                return Claim(ClaimOutcome.IN_FLIGHT)
            return Claim(ClaimOutcome.REPLAY, record.response)

    def complete(self, scope: Scope, response: StoredResponse) -> None:
        """Store the terminal response of a claimed key (unless the store was cleared)."""
        record = self._records.get(scope)
        if record is not None:
            record.response = response

    def release(self, scope: Scope) -> None:
        """Forget a claimed key whose request never started executing."""
        record = self._records.get(scope)
        if record is not None and record.response is None:
            del self._records[scope]

    def in_flight(self) -> set[str]:
        """The Idempotency-Keys (of any account) a request holds right now: claimed, not
        yet completed or released. A test-facing read, so a test can send a concurrent
        request once the first one provably holds its key, not after a pause."""
        return {key for (_, key), record in self._records.items() if record.response is None}

    def prune(self, now: float) -> None:
        """Drop completed records older than the retention."""
        expired = [
            scope
            for scope, record in self._records.items()
            if record.response is not None and now - record.first_seen_at >= self.retention_seconds
        ]
        for scope in expired:
            del self._records[scope]

    def clear(self) -> None:
        """Forget every key."""
        self._records.clear()
