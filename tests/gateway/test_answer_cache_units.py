"""The answer cache's own rules (``onceflow/gateway/_answer_cache.py``), with an injected
clock and an injected "heard" generation: what is remembered, for how long, by what key,
and what makes it forget."""

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from onceflow.gateway._answer_cache import VOUCHED_PER_ENTRY, AnswerCache, is_final
from onceflow.idempotency import IdempotencyRecord, RecordState

READ_AT = datetime(2026, 1, 1, tzinfo=UTC)
KEY = "raw-secret-key-7f3a"
FINGERPRINT = "v1:" + "1" * 64


def final(
    *,
    scope: str = "acme:agent-1:issue_coupon:call",
    key: str = KEY,
    state: RecordState = RecordState.SUCCEEDED,
    status_code: int | None = 200,
    expires_in: timedelta = timedelta(hours=24),
) -> IdempotencyRecord:
    """A record as the table returns it: terminal by default, read at ``READ_AT``."""
    return IdempotencyRecord(
        scope=scope,
        idempotency_key=key,
        request_hash=FINGERPRINT,
        state=state,
        owner_token=None,
        fencing_token=1,
        lease_expires_at=None,
        tenant="acme",
        principal_id=uuid.uuid4(),
        workflow_id="wf-1",
        workflow_run_id="run-1",
        workflow_started_at=READ_AT,
        status_code=status_code,
        resource_id=None,
        response_body={"state": "succeeded", "task_id": "wf-1"},
        result_expires_at=READ_AT + expires_in,
        created_at=READ_AT - timedelta(seconds=1),
        read_at=READ_AT,
    )


@dataclass
class World:
    """What the cache is injected with: a clock and what the gateway has heard."""

    now: float = 1000.0
    generation: int | None = 7

    def cache(self, size: int = 8) -> AnswerCache:
        return AnswerCache(size, heard=lambda: self.generation, clock=lambda: self.now)


def test_a_final_answer_is_answered_from_memory_with_the_requests_key_put_back() -> None:
    world = World()
    cache = world.cache()
    record = final()

    cache.keep(record, read_in=cache.generation())
    remembered = cache.answer(record.scope, KEY)

    assert remembered is not None
    assert remembered == record, "every field as read, the key included"
    assert cache.answer(record.scope, "another-key") is None
    assert cache.answer("acme:agent-2:issue_coupon:call", KEY) is None, "scopes never mix"


def test_the_raw_key_is_never_kept() -> None:
    world = World()
    cache = world.cache()
    cache.keep(final(), read_in=cache.generation())
    # What the cache holds: its slots (scope, full digest) and records with an empty key.
    slots = list(cache._entries)
    records = [entry.record for entry in cache._entries.values()]
    assert all(KEY not in part for slot in slots for part in slot)
    assert [record.idempotency_key for record in records] == [""]
    assert KEY not in repr(cache._entries)


def test_a_record_still_processing_or_an_answer_that_may_change_is_never_remembered() -> None:
    world = World()
    cache = world.cache()
    not_final = [
        final(state=RecordState.PROCESSING, status_code=None),
        final(status_code=202),  # a call that had not ended: refreshed once it ends
        final(status_code=201),  # an open task's creation while it is open
    ]
    for record in not_final:
        assert not is_final(record)
        cache.keep(record, read_in=cache.generation())

    assert len(cache) == 0
    assert cache.answer(not_final[0].scope, KEY) is None
    stored_refusal = final(state=RecordState.FAILED, status_code=409)
    assert is_final(stored_refusal), "a stored refusal is the task's definitive answer"


def test_an_entry_does_not_outlive_its_records_retention() -> None:
    world = World()
    cache = world.cache()
    record = final(expires_in=timedelta(seconds=30))
    cache.keep(record, read_in=cache.generation())

    world.now += 29.9
    assert cache.answer(record.scope, KEY) is not None
    world.now += 0.1
    assert cache.answer(record.scope, KEY) is None, "past its expiry it may be pruned"
    assert len(cache) == 0

    cache.keep(final(expires_in=timedelta(0)), read_in=cache.generation())
    assert len(cache) == 0, "an expired record is not remembered at all"


def test_remembering_again_never_stretches_an_entrys_life() -> None:
    world = World()
    cache = world.cache()
    record = final(expires_in=timedelta(seconds=30))
    cache.keep(record, read_in=cache.generation())
    world.now += 20
    cache.keep(record, read_in=cache.generation())  # the same read, kept again
    world.now += 10
    assert cache.answer(record.scope, KEY) is None


def test_a_change_heard_forgets_everything_and_a_read_begun_before_it_is_not_kept() -> None:
    world = World()
    cache = world.cache()
    cache.keep(final(key="a"), read_in=cache.generation())
    read_in = cache.generation()

    world.generation = 8  # a principal changed, or a prune pass deleted records
    cache.keep(final(key="b"), read_in=read_in)

    assert cache.answer(final().scope, "a") is None
    assert cache.answer(final().scope, "b") is None
    assert len(cache) == 0


def test_nothing_is_remembered_or_answered_while_nothing_is_heard() -> None:
    world = World()
    cache = world.cache()
    cache.keep(final(), read_in=cache.generation())

    world.generation = None  # the listening connection is down
    assert cache.generation() is None
    assert cache.answer(final().scope, KEY) is None
    cache.keep(final(key="b"), read_in=None)
    assert len(cache) == 0

    world.generation = 9  # listening again: it starts from nothing
    assert cache.answer(final().scope, KEY) is None


def test_the_least_recently_answered_entry_goes_first_and_size_zero_keeps_none() -> None:
    world = World()
    cache = world.cache(size=2)
    for key in ("a", "b"):
        cache.keep(final(key=key), read_in=cache.generation())
    assert cache.answer(final().scope, "a") is not None  # "a" answered: "b" is older now
    cache.keep(final(key="c"), read_in=cache.generation())

    assert len(cache) == 2
    assert cache.answer(final().scope, "b") is None
    assert cache.answer(final().scope, "a") is not None
    assert cache.answer(final().scope, "c") is not None

    off = world.cache(size=0)
    assert not off.enabled and off.generation() is None
    off.keep(final(), read_in=7)
    assert len(off) == 0 and off.answer(final().scope, KEY) is None


def test_only_vouched_for_bytes_of_the_remembered_fingerprint_are_answered_unchecked() -> None:
    world = World()
    cache = world.cache()
    record = final()
    scope = record.scope
    assert cache.answer_request(scope, KEY, "bytes-a") is None, "nothing remembered yet"

    cache.keep(record, read_in=cache.generation())
    assert cache.answer_request(scope, KEY, "bytes-a") is None, "not vouched for"

    cache.vouch(scope, KEY, fingerprint="v1:" + "2" * 64, request_digest="bytes-b")
    assert cache.answer_request(scope, KEY, "bytes-b") is None, "another fingerprint"

    cache.vouch(scope, KEY, fingerprint=FINGERPRINT, request_digest="bytes-a")
    assert cache.answer_request(scope, KEY, "bytes-a") == record
    assert cache.answer_request(scope, "another-key", "bytes-a") is None
    assert cache.answer_request("acme:agent-2:issue_coupon:call", KEY, "bytes-a") is None


def test_vouched_for_bytes_are_forgotten_with_their_entry_and_bounded() -> None:
    world = World()
    cache = world.cache()
    record = final()
    cache.keep(record, read_in=cache.generation())
    for number in range(VOUCHED_PER_ENTRY + 1):
        cache.vouch(record.scope, KEY, fingerprint=FINGERPRINT, request_digest=f"b-{number}")
    assert cache.answer_request(record.scope, KEY, f"b-{VOUCHED_PER_ENTRY - 1}") == record
    assert cache.answer_request(record.scope, KEY, f"b-{VOUCHED_PER_ENTRY}") is None

    world.generation = 8  # a change heard: everything goes
    assert cache.answer_request(record.scope, KEY, "b-0") is None
    cache.keep(record, read_in=cache.generation())
    assert cache.answer_request(record.scope, KEY, "b-0") is None, "vouched anew or not at all"
