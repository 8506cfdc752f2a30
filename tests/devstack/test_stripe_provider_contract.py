"""Contract: the official stripe SDK talks to the local provider unchanged.

Every test drives the real ``stripe`` SDK (async methods, ``max_network_retries=0``, an
explicit ``idempotency_key`` on every POST) against a provider served in the test's
event loop, and checks the provider's ledger and request log, not only the response.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
import stripe
from onceflow_devstack.stripe_provider import (
    Fault,
    FaultRule,
    ProviderConfig,
    ProviderControl,
    RunningProvider,
    provider_in_thread,
    running_provider,
)

from tests.harness import HANG_SECONDS, eventually

API_KEY = "sk_test_onceflow_contract"
VISA = {"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True}

# asyncio_mode = "auto" (pyproject) runs the async tests.
pytestmark = [
    # stripe's HTTPXClient posts raw bytes via httpx's deprecated ``data=``; not ours to fix.
    pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning"),
]

ClientFactory = Callable[..., stripe.StripeClient]


def new_key() -> str:
    return f"test-{uuid.uuid4()}"


class SteppedClock:
    """The provider's clock, moved on by the test: time passing is a step of the scenario."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
async def provider() -> AsyncIterator[RunningProvider]:
    async with running_provider(ProviderConfig()) as running:
        yield running


@pytest.fixture
async def control(provider: RunningProvider) -> AsyncIterator[ProviderControl]:
    async with ProviderControl(provider.base_url) as client:
        yield client


@pytest.fixture
async def make_client(provider: RunningProvider) -> AsyncIterator[ClientFactory]:
    http_clients: list[stripe.HTTPXClient] = []

    def build(api_key: str = API_KEY, timeout: float = HANG_SECONDS) -> stripe.StripeClient:
        http_client = stripe.HTTPXClient(timeout=timeout)
        http_clients.append(http_client)
        return stripe.StripeClient(
            api_key,
            base_addresses={"api": provider.base_url},
            max_network_retries=0,
            http_client=http_client,
        )

    yield build
    for http_client in http_clients:
        await http_client.close_async()


@pytest.fixture
def client(make_client: ClientFactory) -> stripe.StripeClient:
    return make_client()


async def charge(
    client: stripe.StripeClient, key: str, **overrides: object
) -> stripe.PaymentIntent:
    params = {**VISA, **overrides}
    return await client.v1.payment_intents.create_async(
        params=params,  # type: ignore[arg-type]
        options={"idempotency_key": key},
    )


async def test_create_then_confirm_succeeds_and_records_one_charge(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    create_key, confirm_key = new_key(), new_key()
    created = await client.v1.payment_intents.create_async(
        params={
            "amount": 2000,
            "currency": "eur",
            "payment_method": "pm_card_visa",
            "metadata": {"operation_id": "op-1", "tenant": "t1"},
            "description": "order 42",
            "automatic_payment_methods": {"enabled": True, "allow_redirects": "never"},
        },
        options={"idempotency_key": create_key},
    )
    assert created.id.startswith("pi_")
    assert created.object == "payment_intent"
    assert created.status == "requires_confirmation"
    assert created.livemode is False
    assert created.metadata.to_dict() == {"operation_id": "op-1", "tenant": "t1"}
    assert await control.ledger() == []

    confirmed = await client.v1.payment_intents.confirm_async(
        created.id, options={"idempotency_key": confirm_key}
    )
    assert confirmed.id == created.id
    assert confirmed.status == "succeeded"
    assert confirmed.amount_received == 2000
    assert confirmed.latest_charge is not None

    fetched = await client.v1.payment_intents.retrieve_async(
        created.id, params={"expand": ["latest_charge"]}
    )
    assert fetched.status == "succeeded"
    assert isinstance(fetched.latest_charge, stripe.Charge)
    assert fetched.latest_charge.amount == 2000

    [entry] = await control.ledger()
    assert (entry.kind, entry.object_id, entry.amount, entry.currency) == (
        "charge",
        created.id,
        2000,
        "eur",
    )
    assert entry.idempotency_key == confirm_key
    assert confirmed.last_response is not None
    assert entry.request_id == confirmed.last_response.request_id
    assert entry.metadata == {"operation_id": "op-1", "tenant": "t1"}
    log = await control.requests()
    assert [(r.method, r.outcome, r.status) for r in log] == [
        ("POST", "executed", 200),
        ("POST", "executed", 200),
        ("GET", "executed", 200),
    ]
    assert [r.idempotency_key for r in log] == [create_key, confirm_key, None]


async def test_request_id_is_readable_from_sdk_responses_and_errors(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    intent = await charge(client, new_key())
    assert intent.last_response is not None
    request_id = intent.last_response.request_id
    assert request_id is not None and request_id.startswith("req_")
    with pytest.raises(stripe.InvalidRequestError) as missing:
        await client.v1.payment_intents.retrieve_async("pi_doesnotexist")
    assert missing.value.http_status == 404
    assert missing.value.code == "resource_missing"
    log = await control.requests()
    assert [r.request_id for r in log] == [request_id, missing.value.request_id]


async def test_declined_card_is_a_card_error_and_commits_no_charge(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    with pytest.raises(stripe.CardError) as declined:
        await charge(client, key, payment_method="pm_card_chargeDeclined")
    assert declined.value.http_status == 402
    assert declined.value.code == "card_declined"
    assert declined.value.error is not None
    assert declined.value.error.decline_code == "generic_decline"
    assert isinstance(declined.value.json_body, dict)
    intent_id = declined.value.json_body["error"]["payment_intent"]["id"]

    intent = await client.v1.payment_intents.retrieve_async(intent_id)
    assert intent.status == "requires_payment_method"
    assert intent.last_payment_error is not None
    assert intent.last_payment_error.code == "card_declined"

    # The decline started executing, so Stripe stores it under the key and replays it.
    with pytest.raises(stripe.CardError) as replayed:
        await charge(client, key, payment_method="pm_card_chargeDeclined")
    assert isinstance(replayed.value.json_body, dict)
    assert replayed.value.json_body["error"]["payment_intent"]["id"] == intent_id
    assert replayed.value.headers is not None
    assert replayed.value.headers.get("idempotent-replayed") == "true"
    assert await control.ledger() == []
    assert [r.outcome for r in await control.requests()] == ["executed", "executed", "replayed"]


async def test_invalid_parameters_are_rejected_and_not_stored_under_the_key(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    with pytest.raises(stripe.InvalidRequestError) as negative:
        await charge(client, key, amount=-5)
    assert (negative.value.http_status, negative.value.param) == (400, "amount")
    assert negative.value.code == "amount_too_small"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        await client.v1.payment_intents.create_async(
            params={"currency": "usd"}, options={"idempotency_key": new_key()}
        )
    assert (missing.value.param, missing.value.code) == ("amount", "parameter_missing")
    with pytest.raises(stripe.InvalidRequestError) as unknown_pm:
        await charge(client, new_key(), payment_method="pm_nope")
    assert (unknown_pm.value.param, unknown_pm.value.code) == ("payment_method", "resource_missing")
    assert await control.ledger() == []

    # Validation failures never started executing: the same key is free for a fixed request.
    intent = await charge(client, key)
    assert intent.status == "succeeded"
    assert [e.idempotency_key for e in await control.ledger()] == [key]
    assert [r.outcome for r in await control.requests()] == [
        "invalid",
        "invalid",
        "invalid",
        "executed",
    ]


async def test_bad_or_missing_api_key_is_an_authentication_error(
    make_client: ClientFactory, provider: RunningProvider, control: ProviderControl
) -> None:
    with pytest.raises(stripe.AuthenticationError) as bad:
        await charge(make_client(api_key="sk_live_not_for_here"), new_key())
    assert bad.value.http_status == 401
    async with httpx.AsyncClient(base_url=provider.base_url) as raw:
        response = await raw.post("/v1/payment_intents", data={"amount": "100"})
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"
    assert response.headers["Request-Id"].startswith("req_")
    assert await control.ledger() == []
    assert [r.outcome for r in await control.requests()] == ["unauthenticated"] * 2
    # Stripe's curl examples authenticate with Basic auth: ``curl -u sk_test_...:``.
    async with httpx.AsyncClient(base_url=provider.base_url, auth=(API_KEY, "")) as raw:
        response = await raw.post(
            "/v1/payment_intents",
            data={"amount": "100", "currency": "usd", "metadata[k]": "v", "expand[]": "x"},
        )
    assert response.status_code == 200
    assert response.json()["metadata"] == {"k": "v"}


async def test_same_key_and_parameters_replays_the_same_intent(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    first = await charge(client, key, metadata={"operation_id": "op-replay"})
    second = await charge(client, key, metadata={"operation_id": "op-replay"})
    assert second.id == first.id
    assert second.last_response is not None and first.last_response is not None
    assert second.last_response.headers["idempotent-replayed"] == "true"
    assert second.last_response.headers["original-request"] == first.last_response.request_id
    assert second.last_response.request_id != first.last_response.request_id
    ledger = await control.ledger()
    assert [(e.kind, e.object_id) for e in ledger] == [("charge", first.id)]
    assert [r.outcome for r in await control.requests()] == ["executed", "replayed"]


async def test_posts_without_a_key_are_simply_executed(
    client: stripe.StripeClient, control: ProviderControl, provider: RunningProvider
) -> None:
    async with httpx.AsyncClient(
        base_url=provider.base_url, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as raw:
        for _ in range(2):
            response = await raw.post("/v1/payment_intents", data={**VISA, "confirm": "true"})
            assert response.status_code == 200
            assert "Idempotent-Replayed" not in response.headers
    ledger = await control.ledger()
    assert len({e.object_id for e in ledger}) == 2
    assert [e.idempotency_key for e in ledger] == [None, None]


async def test_same_key_with_other_parameters_is_an_idempotency_error(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await charge(client, key)
    with pytest.raises(stripe.IdempotencyError) as reused:
        await charge(client, key, amount=9999)
    assert reused.value.http_status == 400
    assert reused.value.error is not None and reused.value.error.type == "idempotency_error"
    # Same key on another endpoint is "other parameters" too.
    with pytest.raises(stripe.IdempotencyError):
        await client.v1.refunds.create_async(
            params={"payment_intent": "pi_x"}, options={"idempotency_key": key}
        )
    assert len(await control.ledger()) == 1
    outcomes = [r.outcome for r in await control.requests()]
    assert outcomes == ["executed", "idempotency_mismatch", "idempotency_mismatch"]


async def test_key_in_flight_gets_409_and_the_effect_happens_once(
    client: stripe.StripeClient, provider: RunningProvider, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(
        Fault.DELAY_BEFORE_COMMIT, path_prefix="/v1/payment_intents", delay_seconds=0.5
    )
    slow = asyncio.create_task(charge(client, key))
    await eventually(
        provider.provider.keys.in_flight, until=lambda keys: key in keys, what="the key is held"
    )
    with pytest.raises(stripe.APIError) as in_use:
        await charge(client, key)
    assert in_use.value.http_status == 409
    assert in_use.value.error is not None
    assert in_use.value.error.code == "idempotency_key_in_use"
    assert in_use.value.error.type == "invalid_request_error"
    intent = await slow
    assert intent.status == "succeeded"
    assert [e.object_id for e in await control.ledger()] == [intent.id]
    log = await control.requests()
    assert [(r.outcome, r.fault) for r in log] == [
        ("executed", "delay_before_commit"),
        ("key_in_use", None),
    ]


async def test_concurrent_requests_with_one_key_commit_one_charge(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    results = await asyncio.gather(*(charge(client, key) for _ in range(8)), return_exceptions=True)
    intents = [r for r in results if isinstance(r, stripe.PaymentIntent)]
    conflicts = [r for r in results if isinstance(r, stripe.APIError)]
    assert len(intents) + len(conflicts) == 8
    assert len({i.id for i in intents}) == 1
    assert all(c.http_status == 409 for c in conflicts)
    assert len(await control.ledger()) == 1


async def test_500_after_commit_is_stored_and_replayed(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.ERROR_500_AFTER_COMMIT)
    with pytest.raises(stripe.APIError) as first:
        await charge(client, key)
    assert first.value.http_status == 500
    # The effect happened although the caller saw a 500.
    [entry] = await control.ledger()
    assert entry.idempotency_key == key
    with pytest.raises(stripe.APIError) as second:
        await charge(client, key)
    assert second.value.http_status == 500
    assert second.value.headers is not None
    assert second.value.headers.get("idempotent-replayed") == "true"
    assert len(await control.ledger()) == 1
    log = await control.requests()
    assert [(r.outcome, r.fault, r.status) for r in log] == [
        ("executed", "error_500_after_commit", 500),
        ("replayed", None, 500),
    ]


async def test_500_before_commit_is_stored_without_an_effect(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.ERROR_500_BEFORE_COMMIT)
    for _ in range(2):
        with pytest.raises(stripe.APIError) as failed:
            await charge(client, key)
        assert failed.value.http_status == 500
    assert await control.ledger() == []
    assert [r.outcome for r in await control.requests()] == ["faulted", "replayed"]
    assert (await charge(client, new_key())).status == "succeeded"
    assert len(await control.ledger()) == 1


async def test_429_is_a_rate_limit_error_and_not_stored(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.RATE_LIMIT_429)
    with pytest.raises(stripe.RateLimitError) as limited:
        await charge(client, key)
    assert limited.value.http_status == 429
    assert await control.ledger() == []
    intent = await charge(client, key)
    assert [e.object_id for e in await control.ledger()] == [intent.id]
    assert [r.outcome for r in await control.requests()] == ["faulted", "executed"]


async def test_503_forever_fails_every_attempt_until_cleared(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.ERROR_503, times=None)
    for _ in range(3):
        with pytest.raises(stripe.APIError) as unavailable:
            await charge(client, key)
        assert unavailable.value.http_status == 503
    assert len(await control.faults()) == 1
    await control.clear_faults()
    await charge(client, key)
    assert len(await control.ledger()) == 1
    log = await control.requests()
    assert [(r.fault, r.status) for r in log] == [("error_503", 503)] * 3 + [(None, 200)]


async def test_drop_after_commit_loses_the_response_but_not_the_charge(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.DROP_AFTER_COMMIT, path_prefix="/v1/payment_intents")
    with pytest.raises(stripe.APIConnectionError):
        await charge(client, key)
    [entry] = await control.ledger()
    assert entry.idempotency_key == key
    retried = await charge(client, key)
    assert retried.id == entry.object_id
    assert retried.status == "succeeded"
    assert len(await control.ledger()) == 1
    log = await control.requests()
    assert [(r.outcome, r.fault, r.status) for r in log] == [
        ("executed", "drop_after_commit", None),
        ("replayed", None, 200),
    ]


async def test_delay_past_client_timeout_is_a_connection_error_after_commit(
    make_client: ClientFactory, control: ProviderControl
) -> None:
    client = make_client(timeout=0.3)
    key = new_key()
    await control.add_fault(Fault.DELAY_AFTER_COMMIT, delay_seconds=0.8)
    with pytest.raises(stripe.APIConnectionError) as timed_out:
        await charge(client, key)
    assert "timeout" in str(timed_out.value).lower() or "timed out" in str(timed_out.value).lower()
    [entry] = await control.ledger()
    retried = await charge(make_client(), key)  # nothing is delayed now: no tight timeout
    assert retried.id == entry.object_id
    assert len(await control.ledger()) == 1


async def test_reset_before_commit_changes_nothing(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.RESET_BEFORE_COMMIT)
    with pytest.raises(stripe.APIConnectionError):
        await charge(client, key)
    assert await control.ledger() == []
    intent = await charge(client, key)
    assert [e.object_id for e in await control.ledger()] == [intent.id]
    assert [(r.outcome, r.fault) for r in await control.requests()] == [
        ("faulted", "reset_before_commit"),
        ("executed", None),
    ]


async def test_key_reused_after_retention_creates_a_second_charge(
    client: stripe.StripeClient, provider: RunningProvider, control: ProviderControl
) -> None:
    provider.provider.account.clock = clock = SteppedClock()
    await control.configure(key_retention_seconds=0.3)
    key = new_key()
    first = await charge(client, key)
    assert (await charge(client, key)).id == first.id
    clock.advance(0.4)
    second = await charge(client, key)
    assert second.id != first.id
    ledger = await control.ledger()
    assert [e.object_id for e in ledger] == [first.id, second.id]
    assert {e.idempotency_key for e in ledger} == {key}


async def test_search_is_eventually_consistent(
    client: stripe.StripeClient, provider: RunningProvider, control: ProviderControl
) -> None:
    provider.provider.account.clock = clock = SteppedClock()
    await control.configure(search_lag_seconds=0.4)
    wanted = await charge(client, new_key(), metadata={"operation_id": "op-s", "tenant": "t1"})
    await charge(client, new_key(), metadata={"operation_id": "op-other", "tenant": "t1"})
    query = "metadata['operation_id']:'op-s' AND metadata[\"tenant\"]:\"t1\" AND status:'succeeded'"
    early = await client.v1.payment_intents.search_async(params={"query": query})
    assert early.object == "search_result"
    assert early.data == [] and early.has_more is False
    clock.advance(0.45)
    later = await client.v1.payment_intents.search_async(params={"query": query})
    assert [i.id for i in later.data] == [wanted.id]
    everything = await client.v1.payment_intents.search_async(
        params={"query": "metadata['tenant']:'t1'", "limit": 1}
    )
    assert len(everything.data) == 1 and everything.has_more is True
    with pytest.raises(stripe.InvalidRequestError) as unsupported:
        await client.v1.payment_intents.search_async(params={"query": "amount>100 OR x:1"})
    assert unsupported.value.param == "query"


async def test_refund_create_retrieve_and_over_refund(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    intent = await charge(client, new_key(), amount=1000)
    refund_key = new_key()
    partial = await client.v1.refunds.create_async(
        params={
            "payment_intent": intent.id,
            "amount": 400,
            "reason": "requested_by_customer",
            "metadata": {"operation_id": "op-r"},
        },
        options={"idempotency_key": refund_key},
    )
    assert partial.id.startswith("re_")
    assert (partial.object, partial.amount, partial.status) == ("refund", 400, "succeeded")
    assert partial.payment_intent == intent.id
    fetched = await client.v1.refunds.retrieve_async(partial.id)
    assert fetched.id == partial.id and fetched.metadata.to_dict() == {"operation_id": "op-r"}

    with pytest.raises(stripe.InvalidRequestError) as too_large:
        await client.v1.refunds.create_async(
            params={"payment_intent": intent.id, "amount": 700},
            options={"idempotency_key": new_key()},
        )
    assert (too_large.value.code, too_large.value.param) == ("amount_too_large", "amount")
    rest = await client.v1.refunds.create_async(
        params={"payment_intent": intent.id}, options={"idempotency_key": new_key()}
    )
    assert rest.amount == 600
    with pytest.raises(stripe.InvalidRequestError) as already:
        await client.v1.refunds.create_async(
            params={"payment_intent": intent.id}, options={"idempotency_key": new_key()}
        )
    assert already.value.code == "charge_already_refunded"
    with pytest.raises(stripe.InvalidRequestError) as missing:
        await client.v1.refunds.create_async(
            params={"payment_intent": "pi_missing"}, options={"idempotency_key": new_key()}
        )
    assert missing.value.code == "resource_missing"
    with pytest.raises(stripe.InvalidRequestError) as no_refund:
        await client.v1.refunds.retrieve_async("re_missing")
    assert no_refund.value.http_status == 404

    ledger = await control.ledger()
    assert [(e.kind, e.amount) for e in ledger] == [
        ("charge", 1000),
        ("refund", 400),
        ("refund", 600),
    ]
    assert ledger[1].idempotency_key == refund_key and ledger[1].object_id == partial.id
    assert {e.payment_intent for e in ledger} == {intent.id}


async def test_control_api_rejects_bad_rules_and_reset_clears_everything(
    provider: RunningProvider, client: stripe.StripeClient, control: ProviderControl
) -> None:
    async with httpx.AsyncClient(base_url=provider.base_url) as raw:
        bad = await raw.post("/_test/faults", json={"fault": "meteor_strike"})
        assert bad.status_code == 400
        assert (await raw.post("/_test/config", json={"search_lag_seconds": -1})).status_code == 400
    await control.configure(key_retention_seconds=5)
    await control.add_fault(Fault.ERROR_503, times=None)
    with pytest.raises(stripe.APIError):
        await charge(client, new_key())
    await control.clear_faults()
    await charge(client, new_key())
    assert len(await control.ledger()) == 1
    await control.reset()
    assert await control.ledger() == []
    assert await control.requests() == []
    assert await control.faults() == []
    assert provider.provider.config.key_retention_seconds == 86400.0


def test_sync_sdk_against_a_provider_in_its_own_thread() -> None:
    with provider_in_thread() as running:
        http_client = stripe.HTTPXClient(timeout=HANG_SECONDS, allow_sync_methods=True)
        client = stripe.StripeClient(
            API_KEY,
            base_addresses={"api": running.base_url},
            max_network_retries=0,
            http_client=http_client,
        )
        running.provider.faults.add(FaultRule(Fault.DROP_AFTER_COMMIT, method="POST"))
        key = new_key()
        options: stripe.RequestOptions = {"idempotency_key": key}
        with pytest.raises(stripe.APIConnectionError):
            client.v1.payment_intents.create(params=VISA, options=options)  # type: ignore[arg-type]
        retried = client.v1.payment_intents.create(params=VISA, options=options)  # type: ignore[arg-type]
        http_client.close()
        ledger = running.provider.account.ledger
        assert [(e.object_id, e.idempotency_key) for e in ledger] == [(retried.id, key)]


async def test_500_before_executing_is_not_stored_so_the_same_key_runs_afresh(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    key = new_key()
    await control.add_fault(Fault.ERROR_500_BEFORE_EXECUTING)
    with pytest.raises(stripe.APIError) as failed:
        await charge(client, key)
    assert failed.value.http_status == 500
    assert failed.value.headers is not None
    assert failed.value.headers.get("idempotent-replayed") is None
    assert await control.ledger() == []
    assert (await client.v1.payment_intents.list_async()).data == []

    retried = await charge(client, key)
    assert retried.status == "succeeded"
    assert retried.last_response is not None
    assert retried.last_response.headers.get("idempotent-replayed") is None
    # Now the key holds a stored result, as for any request that executed.
    assert (await charge(client, key)).id == retried.id
    [intent] = (await client.v1.payment_intents.list_async()).data
    assert intent.id == retried.id
    [entry] = await control.ledger()
    assert (entry.object_id, entry.idempotency_key) == (retried.id, key)
    log = await control.requests()
    assert [(r.method, r.outcome, r.fault, r.status) for r in log] == [
        ("POST", "faulted", "error_500_before_executing", 500),
        ("GET", "executed", None, 200),
        ("POST", "executed", None, 200),
        ("POST", "replayed", None, 200),
        ("GET", "executed", None, 200),
    ]


async def test_list_intents_is_newest_first_and_pages_by_cursor(
    client: stripe.StripeClient, provider: RunningProvider
) -> None:
    provider.provider.account.clock = clock = SteppedClock()
    created: list[str] = []
    for step in range(5):
        if step != 1:  # the first two share a second: the later creation lists first
            clock.advance(1)
        created.append((await charge(client, new_key())).id)
    newest_first = created[::-1]

    everything = await client.v1.payment_intents.list_async()
    assert (everything.to_dict()["object"], everything.url) == ("list", "/v1/payment_intents")
    assert [i.id for i in everything.data] == newest_first
    assert everything.has_more is False
    retrieved = await client.v1.payment_intents.retrieve_async(created[0])
    assert everything.data[-1].to_dict() == retrieved.to_dict()

    page = first = await client.v1.payment_intents.list_async(params={"limit": 2})
    assert [i.id for i in first.data] == newest_first[:2] and first.has_more is True
    visited = [i.id for i in page.data]
    while page.has_more:
        page = await client.v1.payment_intents.list_async(
            params={"limit": 2, "starting_after": page.data[-1].id}
        )
        assert len(page.data) <= 2
        visited += [i.id for i in page.data]
    assert visited == newest_first
    assert [i.id async for i in first.auto_paging_iter()] == newest_first

    # ending_before gives the newer objects nearest the cursor, still newest first.
    before_oldest = await client.v1.payment_intents.list_async(
        params={"limit": 2, "ending_before": created[0]}
    )
    assert [i.id for i in before_oldest.data] == [created[2], created[1]]
    assert before_oldest.has_more is True
    assert [i.id async for i in before_oldest.auto_paging_iter()] == created[1:]

    expanded = await client.v1.payment_intents.list_async(
        params={"limit": 1, "expand": ["data.latest_charge"]}
    )
    assert isinstance(expanded.data[0].latest_charge, stripe.Charge)


async def test_list_filters_by_customer_created_and_payment_intent(
    client: stripe.StripeClient, provider: RunningProvider
) -> None:
    provider.provider.account.clock = clock = SteppedClock()
    older = await charge(client, new_key(), customer="cus_a", amount=1000)
    clock.advance(10)
    cutoff = int(clock.now)
    mine = await charge(client, new_key(), customer="cus_a", amount=1000)
    theirs = await charge(client, new_key(), customer="cus_b", amount=1000)
    intents = client.v1.payment_intents

    by_customer = await intents.list_async(params={"customer": "cus_a"})
    assert [i.id for i in by_customer.data] == [mine.id, older.id]
    recent = await intents.list_async(params={"created": {"gte": cutoff}})
    assert [i.id for i in recent.data] == [theirs.id, mine.id]
    both = await intents.list_async(params={"customer": "cus_a", "created": {"gte": cutoff}})
    assert [i.id for i in both.data] == [mine.id]
    before_cutoff = await intents.list_async(params={"created": {"lt": cutoff}})
    assert [i.id for i in before_cutoff.data] == [older.id]
    exactly = await intents.list_async(params={"created": older.created})
    assert [i.id for i in exactly.data] == [older.id]

    refunds = client.v1.refunds
    first_part = await refunds.create_async(
        params={"payment_intent": mine.id, "amount": 300}, options={"idempotency_key": new_key()}
    )
    clock.advance(10)
    rest = await refunds.create_async(
        params={"payment_intent": mine.id}, options={"idempotency_key": new_key()}
    )
    other = await refunds.create_async(
        params={"payment_intent": theirs.id}, options={"idempotency_key": new_key()}
    )
    every_refund = await refunds.list_async()
    assert (every_refund.to_dict()["object"], every_refund.url) == ("list", "/v1/refunds")
    assert [r.id for r in every_refund.data] == [other.id, rest.id, first_part.id]
    assert every_refund.data[0].to_dict() == (await refunds.retrieve_async(other.id)).to_dict()
    for_mine = await refunds.list_async(params={"payment_intent": mine.id})
    assert [r.id for r in for_mine.data] == [rest.id, first_part.id]
    assert isinstance(theirs.latest_charge, str)
    for_their_charge = await refunds.list_async(params={"charge": theirs.latest_charge})
    assert [r.id for r in for_their_charge.data] == [other.id]
    later = await refunds.list_async(
        params={"payment_intent": mine.id, "created": {"gt": rest.created - 1}}
    )
    assert [r.id for r in later.data] == [rest.id]
    paged = await refunds.list_async(params={"limit": 1, "starting_after": other.id})
    assert [r.id for r in paged.data] == [rest.id] and paged.has_more is True


async def test_list_reads_its_own_writes_while_search_still_lags(
    client: stripe.StripeClient, provider: RunningProvider, control: ProviderControl
) -> None:
    provider.provider.account.clock = SteppedClock()
    await control.configure(search_lag_seconds=60)
    intent = await charge(client, new_key(), metadata={"operation_id": "op-list"})
    searched = await client.v1.payment_intents.search_async(
        params={"query": "metadata['operation_id']:'op-list'"}
    )
    assert searched.data == []
    listed = await client.v1.payment_intents.list_async()
    assert [i.id for i in listed.data] == [intent.id]


async def test_list_rejects_a_bad_limit_and_an_unknown_cursor(
    client: stripe.StripeClient, control: ProviderControl
) -> None:
    await charge(client, new_key())
    for limit in (0, 101):
        with pytest.raises(stripe.InvalidRequestError) as bad_limit:
            await client.v1.payment_intents.list_async(params={"limit": limit})
        assert (bad_limit.value.http_status, bad_limit.value.param) == (400, "limit")
        assert bad_limit.value.error is not None
        assert bad_limit.value.error.type == "invalid_request_error"
    with pytest.raises(stripe.InvalidRequestError) as unknown_intent:
        await client.v1.payment_intents.list_async(params={"starting_after": "pi_missing"})
    assert (unknown_intent.value.http_status, unknown_intent.value.code) == (
        400,
        "resource_missing",
    )
    assert unknown_intent.value.param == "starting_after"
    with pytest.raises(stripe.InvalidRequestError) as unknown_refund:
        await client.v1.refunds.list_async(params={"ending_before": "re_missing"})
    assert (unknown_refund.value.code, unknown_refund.value.param) == (
        "resource_missing",
        "ending_before",
    )
    with pytest.raises(stripe.InvalidRequestError):
        await client.v1.refunds.list_async(params={"limit": 100, "created": {"gte": "soon"}})  # type: ignore[arg-type]
    assert (await client.v1.refunds.list_async(params={"limit": 100})).data == []
    log = await control.requests()
    assert [r.outcome for r in log] == ["executed"] + ["invalid"] * 5 + ["executed"]
