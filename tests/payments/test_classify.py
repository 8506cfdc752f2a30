"""``classify_stripe_error`` over real SDK exceptions, produced by the local provider.

Each case makes one real call with the ``StripeClient`` onceflow builds
(``build_stripe_client``) and classifies what the SDK raised; the provider's ledger
shows whether an effect happened, which is what the class claims to know.
"""

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import stripe
from onceflow_devstack.stripe_provider import Fault, ProviderControl, RunningProvider

from onceflow.payments import build_stripe_client, classify_stripe_error
from onceflow.retry_policy import OutcomeClass
from tests.harness import eventually

from .conftest import stripe_settings

pytestmark = [
    # stripe's HTTPXClient posts raw bytes via httpx's deprecated ``data=``; not ours to fix.
    pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning"),
]

VISA = {"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True}


@pytest.fixture
async def client(provider: RunningProvider) -> AsyncIterator[stripe.StripeClient]:
    built = build_stripe_client(stripe_settings(provider.base_url))
    yield built
    await built._requestor._client.close_async()  # type: ignore[union-attr]


async def charge(client: stripe.StripeClient, key: str | None = None, **overrides: Any) -> None:
    await client.v1.payment_intents.create_async(
        params={**VISA, **overrides},  # type: ignore[arg-type]
        options={"idempotency_key": key or f"k-{uuid.uuid4()}"},
    )


async def raised_by(call: Any) -> BaseException:
    with pytest.raises(Exception) as caught:
        await call
    return caught.value


@pytest.mark.parametrize(
    ("fault", "expected", "charged"),
    [
        (Fault.RATE_LIMIT_429, OutcomeClass.TRANSIENT, 0),
        (Fault.ERROR_503, OutcomeClass.UNKNOWN, 0),
        (Fault.ERROR_500_BEFORE_COMMIT, OutcomeClass.UNKNOWN, 0),
        (Fault.ERROR_500_AFTER_COMMIT, OutcomeClass.UNKNOWN, 1),
        (Fault.DROP_AFTER_COMMIT, OutcomeClass.UNKNOWN, 1),
        # A reset after the request was written cannot be told apart from one after the
        # commit, so it is unknown even though this provider reset before committing.
        (Fault.RESET_BEFORE_COMMIT, OutcomeClass.UNKNOWN, 0),
    ],
)
async def test_injected_faults_are_classified_by_what_they_can_prove(
    client: stripe.StripeClient,
    control: ProviderControl,
    fault: Fault,
    expected: OutcomeClass,
    charged: int,
) -> None:
    await control.add_fault(fault)
    error = await raised_by(charge(client))
    outcome, reason = classify_stripe_error(error)
    assert outcome is expected, reason
    assert len(await control.ledger()) == charged
    assert "sk_test" not in reason


async def test_a_timeout_after_the_provider_committed_is_unknown(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    await control.add_fault(Fault.DELAY_AFTER_COMMIT, delay_seconds=1.5)
    error = await raised_by(charge(client))
    assert isinstance(error, stripe.APIConnectionError)
    outcome, reason = classify_stripe_error(error)
    assert outcome is OutcomeClass.UNKNOWN
    assert "timed out" in reason
    assert len(await control.ledger()) == 1


async def test_a_refused_connection_is_transient_because_nothing_was_sent() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    client = build_stripe_client(stripe_settings(f"http://127.0.0.1:{closed_port}"))
    error = await raised_by(charge(client))
    assert isinstance(error, stripe.APIConnectionError)
    outcome, reason = classify_stripe_error(error)
    assert outcome is OutcomeClass.TRANSIENT
    assert "never sent" in reason


async def test_a_replayed_500_is_unknown_and_says_it_was_replayed(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT)
    key = f"k-{uuid.uuid4()}"
    await raised_by(charge(client, key))
    replayed = await raised_by(charge(client, key))
    outcome, reason = classify_stripe_error(replayed)
    assert outcome is OutcomeClass.UNKNOWN
    assert "replayed" in reason
    assert len(await control.ledger()) == 1


async def test_a_key_in_flight_is_transient(
    client: stripe.StripeClient, provider: RunningProvider, control: ProviderControl
) -> None:
    await control.add_fault(Fault.DELAY_BEFORE_COMMIT, delay_seconds=0.5)
    key = f"k-{uuid.uuid4()}"
    first = asyncio.create_task(charge(client, key))
    await eventually(
        provider.provider.keys.in_flight, until=lambda keys: key in keys, what="the key is held"
    )
    error = await raised_by(charge(client, key))
    await first
    assert isinstance(error, stripe.APIError) and error.code is None  # code only in .error
    outcome, reason = classify_stripe_error(error)
    assert outcome is OutcomeClass.TRANSIENT
    assert "409 idempotency_key_in_use" in reason
    assert len(await control.ledger()) == 1


async def test_permanent_errors_are_rejected(
    client: stripe.StripeClient, provider: RunningProvider, control: ProviderControl
) -> None:
    declined = await raised_by(charge(client, payment_method="pm_card_chargeDeclined"))
    invalid = await raised_by(charge(client, amount=-1))
    missing = await raised_by(client.v1.payment_intents.retrieve_async("pi_missing"))
    wrong_key = build_stripe_client(
        stripe_settings(provider.base_url, api_key="sk_live_not_for_here")
    )
    unauthenticated = await raised_by(charge(wrong_key))

    assert isinstance(declined, stripe.CardError)
    assert classify_stripe_error(declined)[0] is OutcomeClass.REJECTED
    assert "card_declined (generic_decline)" in classify_stripe_error(declined)[1]
    for error in (invalid, missing, unauthenticated):
        assert classify_stripe_error(error)[0] is OutcomeClass.REJECTED, error
    assert isinstance(unauthenticated, stripe.AuthenticationError)
    assert "sk_live" not in classify_stripe_error(unauthenticated)[1]
    assert await control.ledger() == []


async def test_an_idempotency_error_is_rejected_and_logged_as_a_bug(
    client: stripe.StripeClient, control: ProviderControl, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"k-{uuid.uuid4()}"
    await charge(client, key)
    error = await raised_by(charge(client, key, amount=9999))
    assert isinstance(error, stripe.IdempotencyError)
    with caplog.at_level(logging.ERROR, logger="payments"):
        outcome, reason = classify_stripe_error(error)
    assert outcome is OutcomeClass.REJECTED
    assert "bug" in reason
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "bug in onceflow" in record.getMessage()
    assert key not in record.getMessage()
    assert len(await control.ledger()) == 1


def test_anything_else_is_unknown() -> None:
    assert classify_stripe_error(RuntimeError("boom"))[0] is OutcomeClass.UNKNOWN
    assert classify_stripe_error(stripe.APIError("no status"))[0] is OutcomeClass.UNKNOWN


def test_the_client_is_built_with_network_retries_off_and_explicit_timeouts() -> None:
    client = build_stripe_client(
        stripe_settings("http://127.0.0.1:9", request_timeout=timedelta(seconds=7))
    )
    assert client._requestor._options.max_network_retries == 0
    http_client = client._requestor._client
    assert isinstance(http_client, stripe.HTTPXClient)
    timeout = http_client._timeout
    assert (timeout.read, timeout.write, timeout.connect) == (7.0, 7.0, 5.0)
    with pytest.raises(ValueError, match="STRIPE_API_KEY"):
        build_stripe_client(stripe_settings("http://127.0.0.1:9", api_key=None))
