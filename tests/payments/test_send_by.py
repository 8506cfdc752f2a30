"""The send-by deadline where the request leaves: ``charge_payment`` run as an activity
against the local provider and PostgreSQL. Past the key's send-by deadline (its recorded
first send + retention - margin) the attempt sends nothing, whatever the workflow
decided; the provider's request log is the judge."""

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
from onceflow_devstack.stripe_provider import ProviderControl
from psycopg_pool import AsyncConnectionPool

from onceflow.payments import PaymentToolSettings, StripePaymentProvider, charge_payment_contract
from onceflow.retry_policy import OutcomeClass
from onceflow.tools.worker import (
    FIRST_SENT_AT,
    KeyUnusable,
    ToolCallInput,
    derive_child_key,
    tool_activities,
)
from tests.harness import attempt_environment

from .conftest import ACCOUNT, CHARGE_PAYMENT, TENANT, VISA_CHARGE

PINNED = charge_payment_contract(
    PaymentToolSettings(key_retention=timedelta(hours=2), retention_margin=timedelta(minutes=30))
).policy()
"""The policy a task pinned: keys kept 2 h, so nothing is sent 90 min after the first send."""


def attempt(workflow_id: str, number: int) -> ToolCallInput:
    return ToolCallInput(
        tenant=TENANT,
        principal="agent-7",
        workflow_id=workflow_id,
        step_id="pay",
        tool="charge_payment",
        arguments=VISA_CHARGE,
        attempt=number,
        policy=PINNED,
    )


async def test_an_attempt_past_its_keys_send_by_deadline_sends_nothing(
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    control: ProviderControl,
    database: str,
) -> None:
    workflow_id = f"task-{uuid.uuid4().hex}"
    key = derive_child_key(
        tenant=TENANT,
        workflow_id=workflow_id,
        step_id="pay",
        child_op="charge",
        provider_account=ACCOUNT,
    )
    [perform, _] = tool_activities(CHARGE_PAYMENT, pool, payment_provider)
    env = attempt_environment()

    first = await env.run(perform, attempt(workflow_id, 1))
    assert first.outcome is OutcomeClass.SUCCEEDED
    assert first.evidence[FIRST_SENT_AT]
    # Scenario: the step's record says its key first left 91 minutes ago, and the last
    # attempt's answer was lost (the record is still 'started').
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "UPDATE operations SET state = 'started', correlation = jsonb_set(correlation, "
            "%s, to_jsonb(to_char((now() - interval '91 minutes') AT TIME ZONE 'UTC', "
            """'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))) WHERE child_key = %s""",
            ([FIRST_SENT_AT], key),
        )
    posts_before = len([r for r in await control.requests() if r.method == "POST"])

    refused = await env.run(perform, attempt(workflow_id, 2))

    assert refused.outcome is OutcomeClass.TRANSIENT
    assert refused.key_unusable is KeyUnusable.SEND_BY_PASSED
    assert (refused.reason or "").startswith("not sent: the send-by deadline")
    assert "retention 2:00:00 - margin 0:30:00" in (refused.reason or "")
    assert refused.evidence["key_send_by"]
    assert len([r for r in await control.requests() if r.method == "POST"]) == posts_before
    assert len(await control.ledger()) == 1


async def test_an_attempt_temporal_has_given_up_sends_nothing_even_its_first_send(
    pool: AsyncConnectionPool,
    payment_provider: StripePaymentProvider,
    control: ProviderControl,
    database: str,
) -> None:
    # A worker paused past the attempt's timeout runs it when it wakes: the workflow may
    # already have looked the charge up, parked it, or moved it to a new key generation.
    workflow_id = f"task-{uuid.uuid4().hex}"
    [perform, _] = tool_activities(CHARGE_PAYMENT, pool, payment_provider)
    env = attempt_environment(timeout=timedelta(seconds=60))
    env.info = replace(env.info, started_time=datetime.now(UTC) - timedelta(seconds=61))

    stale = await env.run(perform, attempt(workflow_id, 1))

    assert stale.outcome is OutcomeClass.TRANSIENT
    assert (stale.reason or "").startswith("not sent: this attempt started at")
    assert [r for r in await control.requests() if r.method == "POST"] == []
    with psycopg.connect(database) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM operations WHERE workflow_id = %s", (workflow_id,)
        ).fetchone()
    assert rows == (0,)  # no first send recorded either
    # Near the end of its time (within a quarter of it) an attempt sends nothing too;
    # with its time ahead, it sends.
    env.info = replace(env.info, started_time=datetime.now(UTC) - timedelta(seconds=52))
    assert (await env.run(perform, attempt(workflow_id, 2))).outcome is OutcomeClass.TRANSIENT
    env.info = replace(env.info, started_time=datetime.now(UTC))
    assert (await env.run(perform, attempt(workflow_id, 3))).outcome is OutcomeClass.SUCCEEDED
    assert len(await control.ledger()) == 1
