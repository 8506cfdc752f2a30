"""Final answers of idempotency records kept in memory, for a storm of repeats.

An agent fleet retries: every replica of an agent that saw a timeout sends the same key
again, often hundreds of times a second. Once a record holds a final answer (a terminal
record whose answer will never change) every one of those repeats gets the same status
and body, so a gateway remembers the most recent of them and answers a repeat without
reading PostgreSQL. What is remembered, and when it is forgotten:

* only a **final** answer: a terminal record whose stored answer is not one a later
  request may replace (a call's ``202``, refreshed once the call ends; an open task's
  ``201``). A record still processing is never remembered;
* keyed by the record's scope and a SHA-256 digest of its key; the raw key is never kept
  (the remembered record holds an empty key, the request's own is put back on a hit);
* the request's fingerprint is compared exactly as with a record read from the table:
  another request under the key is refused the same way (``Claims.settle``);
* an entry lives no longer than its record: it carries the record's result expiry, as
  time left when it was read (both instants on the database clock, so a skewed gateway
  clock does not matter), and is refused once that time has passed;
* everything is forgotten whenever the gateway hears of a change (``heard``: the
  principal cache's generation, which moves on any principal or API-key change and on
  every prune pass that deleted records), and nothing is remembered or answered while it
  hears nothing (its listening connection is down);
* a read begun before such a change is not remembered (the generation it began in);
* at most ``size`` entries, the least recently answered evicted first; 0 remembers none.

A repeat is the same request sent again, byte for byte. So an entry also remembers the
digests of requests (a transport's digest of the route and the body exactly as sent)
that have been *vouched* for: checked in full once (parsed, validated, fingerprinted) and
found to carry the record's fingerprint. A later request with one of those digests is
answered (``answer_request``) without being parsed or fingerprinted again: identical
bytes make an identical fingerprint. At most ``VOUCHED_PER_ENTRY`` digests an entry (a
storm's senders seldom send more than a few spellings of one body).

Authentication and authorization run before a request gets here, so a revoked key or a
tool taken away is refused before anything is answered from memory.
"""

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta

from onceflow.idempotency import IdempotencyRecord

NOT_FINAL_STATUS_CODES = frozenset({201, 202})
"""Stored answers a later request may replace: a call that had not ended when it was
answered (202, refreshed once it ends) and an open task's creation (201 while it is
open). Never remembered."""

VOUCHED_PER_ENTRY = 8
"""Request digests an entry vouches for; later spellings are checked in full each time."""


@dataclass(frozen=True)
class _Entry:
    record: IdempotencyRecord
    """The record as read, with an empty key."""
    until: float
    """Clock time after which the record's result may have been pruned."""
    vouched: set[str] = field(default_factory=set)
    """Digests of requests found to carry the record's fingerprint."""


def is_final(record: IdempotencyRecord) -> bool:
    """Whether the record's stored answer can never change: terminal, and not an answer a
    later request refreshes."""
    return record.is_terminal and record.status_code not in NOT_FINAL_STATUS_CODES


class AnswerCache:
    """The final answers this gateway read lately, by scope and key digest.

    Pure: the clock and what the gateway hears (``heard``) are injected. ``heard`` returns
    a number that changes whenever something the cache depends on may have changed (any
    principal or API key, records pruned), or None while the gateway hears nothing.
    """

    def __init__(
        self,
        size: int,
        *,
        heard: Callable[[], int | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._size = size
        self._heard = heard
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._generation: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        """Whether anything is ever remembered (``size`` > 0)."""
        return self._size > 0

    def generation(self) -> int | None:
        """What the gateway has heard now; read it before a database read and pass it to
        ``keep`` (None: nothing may be remembered from the read)."""
        if not self._size:
            return None
        return self._current()

    def answer(self, scope: str, idempotency_key: str) -> IdempotencyRecord | None:
        """The remembered final record of ``(scope, key)`` with the request's key put
        back, or None (then read the table)."""
        entry = self._live(scope, idempotency_key)
        if entry is None:
            return None
        return replace(entry.record, idempotency_key=idempotency_key)

    def answer_request(
        self, scope: str, idempotency_key: str, request_digest: str
    ) -> IdempotencyRecord | None:
        """``answer``, only for a request whose digest was vouched for under the key: its
        fingerprint is known to match without computing it. None: check it in full."""
        entry = self._live(scope, idempotency_key)
        if entry is None or request_digest not in entry.vouched:
            return None
        return replace(entry.record, idempotency_key=idempotency_key)

    def vouch(
        self, scope: str, idempotency_key: str, *, fingerprint: str, request_digest: str
    ) -> None:
        """Note that the request with ``request_digest``, checked in full, has
        ``fingerprint``: if that is the remembered record's, the same bytes are answered
        by ``answer_request`` from now on."""
        entry = self._live(scope, idempotency_key)
        if (
            entry is not None
            and entry.record.request_hash == fingerprint
            and len(entry.vouched) < VOUCHED_PER_ENTRY
        ):
            entry.vouched.add(request_digest)

    def _live(self, scope: str, idempotency_key: str) -> _Entry | None:
        if not self._entries or self._current() is None:
            return None
        slot = (scope, _digest(idempotency_key))
        entry = self._entries.get(slot)
        if entry is None:
            return None
        if entry.until <= self._clock():
            # Its record may be pruned by now: a retry must meet the table.
            del self._entries[slot]
            return None
        self._entries.move_to_end(slot)
        return entry

    def keep(self, record: IdempotencyRecord, *, read_in: int | None) -> None:
        """Remember a record read from the table in generation ``read_in`` (from
        ``generation()`` before the read) if its answer is final, nothing has changed
        since the read began, and its result has not expired."""
        if not self._size or read_in is None or not is_final(record):
            return
        if self._current() != read_in:
            return
        left = record.result_expires_at - record.read_at
        if left <= timedelta(0):
            return
        slot = (record.scope, _digest(record.idempotency_key))
        if slot in self._entries:
            # A final answer never changes; remembering it again would only stretch its
            # lifetime past its record's.
            return
        self._entries[slot] = _Entry(
            record=replace(record, idempotency_key=""),
            until=self._clock() + left.total_seconds(),
        )
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def _current(self) -> int | None:
        """What the gateway has heard, forgetting everything once it changed."""
        generation = self._heard()
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
        return generation


def _digest(idempotency_key: str) -> str:
    # The whole digest: two keys of one scope must never share an entry (the 16-hex
    # ``key_digest`` of the logs is short enough for a collision to be conceivable).
    return hashlib.sha256(idempotency_key.encode()).hexdigest()
