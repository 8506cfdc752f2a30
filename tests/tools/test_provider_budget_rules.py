"""The provider budget's rules (pure): who may send, and what each answer changes."""

from datetime import UTC, datetime, timedelta

import pytest

from onceflow.tools._provider import (
    Answer,
    BudgetRow,
    Pause,
    Provider,
    ProviderHealth,
    Send,
    admit,
    after_answer,
)

STRIPE = Provider(name="stripe", retry_tokens=3, probe_every=timedelta(seconds=10))
T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_first_attempts_are_never_held_by_the_bucket() -> None:
    empty_and_failing = BudgetRow(tokens=0, refilled_at=T0, failing_since=T0)
    admission, row = admit(empty_and_failing, STRIPE, Send.FIRST, at(1))
    assert admission.admitted and row == empty_and_failing
    admission, _ = admit(empty_and_failing, STRIPE, Send.OPERATOR, at(1))
    assert admission.admitted


def test_a_retry_takes_a_token_and_an_answered_retry_repays_it() -> None:
    admission, row = admit(BudgetRow.full(STRIPE), STRIPE, Send.RETRY, T0)
    assert admission.admitted and row.tokens == 2
    row = after_answer(row, STRIPE, Send.RETRY, Answer.ANSWERED, T0)
    assert row.tokens == 3  # repaid, and the deposit is capped at the bucket's size
    # A retry that reached nothing after all (its intent was held elsewhere) repays too.
    _, row = admit(row, STRIPE, Send.RETRY, T0)
    assert after_answer(row, STRIPE, Send.RETRY, Answer.NOT_SENT, T0).tokens == 3


def test_while_it_fails_retries_stop_at_the_bucket_then_one_probe_per_interval() -> None:
    row = BudgetRow.full(STRIPE)
    sent = []
    for tick in range(3000):  # 300 s of retries asking every 0.1 s, every one failing
        now = at(tick / 10)
        admission, row = admit(row, STRIPE, Send.RETRY, now)
        if admission.admitted:
            sent.append(now)
            row = after_answer(row, STRIPE, Send.RETRY, Answer.FAILED, now)
        else:
            assert admission.health is ProviderHealth.SHEDDING_RETRIES
            assert "waiting for stripe to recover" in admission.reason
            assert admission.recheck_in <= STRIPE.probe_every
    # The documented bound: the bucket, then one retry (a probe) per probe_every.
    assert len(sent) <= STRIPE.retry_tokens + 300 / 10
    assert len(sent) >= STRIPE.retry_tokens + 300 / 10 - 1
    assert row.health(STRIPE, at(299.95)) is ProviderHealth.SHEDDING_RETRIES


def test_an_answer_while_failing_refills_the_bucket() -> None:
    row = BudgetRow(tokens=0, refilled_at=T0, failing_since=T0)
    admission, _ = admit(row, STRIPE, Send.RETRY, at(5))
    assert not admission.admitted and admission.recheck_in == timedelta(seconds=5)
    admission, row = admit(row, STRIPE, Send.RETRY, at(10))  # a token refilled: the probe
    assert admission.admitted
    row = after_answer(row, STRIPE, Send.RETRY, Answer.ANSWERED, at(10))
    assert (row.tokens, row.failing_since) == (STRIPE.retry_tokens, None)
    assert row.health(STRIPE, at(11)) is ProviderHealth.HEALTHY


def test_an_empty_bucket_without_failures_asks_again_in_a_moment() -> None:
    row = BudgetRow(tokens=0.5, refilled_at=T0)  # every token out with a retry running
    admission, after = admit(row, STRIPE, Send.RETRY, T0)
    assert not admission.admitted and admission.recheck_in == timedelta(seconds=1)
    assert admission.health is ProviderHealth.HEALTHY and after == row


def test_a_429_holds_every_send_for_its_retry_after_or_the_default() -> None:
    row = after_answer(
        BudgetRow.full(STRIPE),
        STRIPE,
        Send.FIRST,
        Answer.THROTTLED,
        T0,
        throttled_for=timedelta(seconds=7),
    )
    assert row.hold_until == at(7) and row.failing_since == T0
    for send in Send:
        admission, _ = admit(row, STRIPE, send, at(2))
        assert not admission.admitted and admission.health is ProviderHealth.THROTTLED
        assert admission.recheck_in == timedelta(seconds=5)
    assert admit(row, STRIPE, Send.FIRST, at(7))[0].admitted
    # A 429 without Retry-After holds for throttle_hold; a later 429 never shortens a hold.
    shorter = after_answer(row, STRIPE, Send.FIRST, Answer.THROTTLED, at(1))
    assert shorter.hold_until == at(7)


def test_a_paused_provider_sends_nothing_and_says_who_paused_it() -> None:
    row = BudgetRow(tokens=3, pause=Pause(by="ops@example.com", at=T0, reason="stripe incident"))
    for send in Send:
        admission, after = admit(row, STRIPE, send, at(60))
        assert not admission.admitted and after == row
        assert admission.health is ProviderHealth.PAUSED
        assert "ops@example.com" in admission.reason and "stripe incident" in admission.reason
        assert "onceflow provider resume stripe" in admission.reason


@pytest.mark.parametrize(
    "bad",
    [
        {"name": ""},
        {"name": "stripe live"},
        {"name": "stripe", "retry_tokens": 0.5},
        {"name": "stripe", "retry_deposit": -1},
        {"name": "stripe", "probe_every": timedelta(0)},
        {"name": "stripe", "requests_per_second": 0},
    ],
)
def test_a_provider_declaration_is_checked(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Provider(**bad)  # type: ignore[arg-type]
