"""``onceflow audit`` for payments: the comparison on its own, then the command end to end
against the local Stripe-compatible provider (over HTTP, the real SDK) and PostgreSQL.

The end-to-end tests make their charges with the real ``charge_payment`` and
``refund_payment`` activities (in ``ActivityEnvironment``, no workflow): the operations
rows and the PaymentIntents' metadata are exactly what a task's steps write, which is all
the audit reads. What must not happen in onceflow is planted from outside, as it would
happen: a second PaymentIntent for one operation under another key, a PaymentIntent for
an operation no step began, a PaymentIntent the provider no longer has (forgotten with
the provider's ``/_test/forget``, as Stripe's "delete test data" does; Stripe's API
deletes no PaymentIntent).
"""

import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from onceflow_devstack.stripe_provider import Fault, ProviderControl, RunningProvider
from psycopg_pool import AsyncConnectionPool

from onceflow.cli._audit import FINDINGS_EXIT_CODE, parse_duration, parse_moment
from onceflow.cli._failures import CommandFailed
from onceflow.payments import (
    ChargeRequest,
    PaymentsAuditInput,
    PaymentsAuditor,
    ProviderEffect,
    StripePaymentProvider,
    compare_payments,
)
from onceflow.payments._audit import unlisted_resources, unowned_steps
from onceflow.retry_policy import OutcomeClass
from onceflow.tools import AuditWindow, EffectTotal, FindingKind, OperationRecord
from onceflow.tools.worker import derive_child_key, key_digest, tool_activities
from tests.harness import REPO, attempt_environment

from .conftest import ACCOUNT, API_KEY, REFUND_PAYMENT, TENANT, Charge, step_call

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
WINDOW = AuditWindow(since=NOW - timedelta(hours=1), until=NOW)


# ── the comparison ──────────────────────────────────────────────────────────────────


def record(
    step: str,
    state: str = "succeeded",
    resource: str | None = None,
    *,
    child_op: str = "charge",
    generation: int = 1,
    workflow: str = "task-1",
    updated: datetime = NOW - timedelta(minutes=30),
) -> OperationRecord:
    return OperationRecord(
        operation_id=f"sha256:{workflow}-{step}-{child_op}-{generation}",
        tenant=TENANT,
        workflow_id=workflow,
        step_id=step,
        tool="charge_payment" if child_op == "charge" else "refund_payment",
        child_op=child_op,
        state=state,
        resource_id=resource,
        generation=generation,
        created_at=updated - timedelta(seconds=1),
        updated_at=updated,
    )


def effect(
    resource: str,
    owner: OperationRecord | None = None,
    *,
    kind: str = "charge",
    status: str = "succeeded",
    amount: int = 4200,
    currency: str = "eur",
    operation_id: str | None = None,
) -> ProviderEffect:
    metadata = {}
    if owner is not None or operation_id is not None:
        metadata["onceflow_operation"] = operation_id or (owner.operation_id if owner else "")
    if owner is not None:
        metadata |= {
            "onceflow_tenant": owner.tenant,
            "onceflow_workflow_id": owner.workflow_id,
            "onceflow_step": owner.step_id,
        }
    return ProviderEffect(
        kind=kind, id=resource, status=status, amount=amount, currency=currency, metadata=metadata
    )


def compare(
    effects: list[ProviderEffect],
    operations: list[OperationRecord],
    *,
    step_operations: tuple[OperationRecord, ...] = (),
    retrieved: dict[str, ProviderEffect | None] | None = None,
) -> Any:
    return compare_payments(
        PaymentsAuditInput(
            window=WINDOW,
            audited_at=NOW,
            effects=effects,
            operations=operations,
            step_operations=step_operations,
            retrieved=retrieved,
        )
    )


def test_a_window_where_every_effect_is_its_steps_one_is_clean_with_its_totals() -> None:
    pay, pay_usd = record("pay", resource="pi_1"), record("pay-2", resource="pi_2")
    give_back = record("back", resource="re_1", child_op="refund")
    report = compare(
        [
            effect("pi_1", pay),
            effect("pi_2", pay_usd, amount=1000, currency="usd"),
            effect("re_1", give_back, kind="refund", amount=200),
            # Not onceflow's, or no money moved: left alone.
            effect("pi_foreign"),
            effect("pi_declined", operation_id="sha256:nobody", status="requires_payment_method"),
        ],
        [pay, pay_usd, give_back],
    )
    assert report.clean and report.findings == ()
    assert report.counts == {"duplicate": 0, "orphan": 0, "missing": 0}
    assert report.totals == (
        EffectTotal(kind="charge", currency="eur", count=1, amount=4200),
        EffectTotal(kind="charge", currency="usd", count=1, amount=1000),
        EffectTotal(kind="refund", currency="eur", count=1, amount=200),
    )
    assert (report.operations_read, report.effects_read) == (3, 5)


def test_a_second_effect_of_one_operation_is_a_duplicate_naming_the_recorded_one_first() -> None:
    pay = record("pay", resource="pi_1")
    report = compare([effect("pi_2", pay), effect("pi_1", pay)], [pay])
    [finding] = report.findings
    assert finding.kind is FindingKind.DUPLICATE
    assert finding.resource_ids == ("pi_1", "pi_2")
    assert (finding.workflow_id, finding.step_id, finding.step_state) == (
        "task-1",
        "pay",
        "succeeded",
    )
    assert "recorded pi_1, 1 more" in finding.detail
    assert report.totals == (EffectTotal(kind="charge", currency="eur", count=2, amount=8400),)


def test_effects_under_two_key_generations_of_one_step_are_a_duplicate() -> None:
    first = record("pay", "started", generation=1, updated=NOW - timedelta(hours=2))
    second = record("pay", resource="pi_2", generation=2)
    report = compare([effect("pi_1", first), effect("pi_2", second)], [first, second])
    [finding] = report.findings
    assert finding.kind is FindingKind.DUPLICATE and finding.resource_ids == ("pi_2", "pi_1")


def test_a_refund_beyond_the_recorded_one_is_a_duplicate_too() -> None:
    back = record("back", resource="re_1", child_op="refund")
    report = compare(
        [effect("re_1", back, kind="refund"), effect("re_2", back, kind="refund")], [back]
    )
    [finding] = report.findings
    assert (finding.kind, finding.tool) == (FindingKind.DUPLICATE, "refund_payment")


def test_an_effect_no_step_owns_is_an_orphan() -> None:
    stranger = record("pay", workflow="task-never-begun")
    report = compare([effect("pi_9", stranger)], [])
    [finding] = report.findings
    assert finding.kind is FindingKind.ORPHAN
    assert finding.resource_ids == ("pi_9",) and finding.step_state is None
    assert finding.workflow_id == "task-never-begun"  # from the effect's metadata
    assert "which no step's record has" in finding.detail


@pytest.mark.parametrize("state", ["failed", "started"])
def test_the_effect_of_a_step_that_did_not_succeed_is_an_orphan(state: str) -> None:
    abandoned = record("pay", state, updated=NOW - timedelta(hours=2))
    report = compare([effect("pi_1", abandoned)], [abandoned])
    [finding] = report.findings
    assert (finding.kind, finding.step_state) == (FindingKind.ORPHAN, state)
    assert f"which is {state}" in finding.detail


def test_a_step_still_running_within_the_grace_is_in_flight_not_an_orphan() -> None:
    running = record("pay", "started", updated=NOW - timedelta(minutes=5))
    report = compare([effect("pi_1", running)], [running])
    assert report.clean and report.in_flight == 1


def test_a_step_recorded_before_the_window_owns_its_effect_in_the_window() -> None:
    early = record("pay", resource="pi_1", updated=NOW - timedelta(days=2))
    listed = [effect("pi_1", early)]
    assert unowned_steps(listed, []) == {(TENANT, "task-1", "pay")}
    assert compare(listed, [], step_operations=(early,)).clean


def test_a_succeeded_step_whose_resource_the_provider_lacks_is_missing() -> None:
    gone, canceled, late = (
        record("pay", resource="pi_gone"),
        record("pay-2", resource="pi_canceled"),
        record("pay-3", resource="pi_late"),
    )
    operations = [gone, canceled, late]
    assert unlisted_resources([], operations) == [
        ("charge", "pi_canceled"),
        ("charge", "pi_gone"),
        ("charge", "pi_late"),
    ]
    report = compare(
        [],
        operations,
        retrieved={
            "pi_gone": None,
            "pi_canceled": effect("pi_canceled", canceled, status="canceled"),
            # Created just past the window's end: there, so nothing is missing.
            "pi_late": effect("pi_late", late),
        },
    )
    assert [(f.kind, f.resource_ids) for f in report.findings] == [
        (FindingKind.MISSING, ("pi_gone",)),
        (FindingKind.MISSING, ("pi_canceled",)),
    ]
    assert "the provider has no PaymentIntent pi_gone" in report.findings[0].detail
    assert "pi_canceled is canceled: no money moved" in report.findings[1].detail
    # A resource neither listed nor read by id proves nothing: refused, not guessed.
    with pytest.raises(ValueError, match="neither listed nor read"):
        compare([], [gone])


def test_the_report_as_json_and_the_window_checked() -> None:
    pay = record("pay", resource="pi_1")
    document = compare([effect("pi_1", pay), effect("pi_2", pay)], [pay]).to_json()
    assert document["clean"] is False
    assert document["counts"] == {"duplicate": 1, "orphan": 0, "missing": 0}
    assert document["findings"][0]["resource_ids"] == ["pi_1", "pi_2"]
    assert document["totals"] == [{"kind": "charge", "currency": "eur", "count": 2, "amount": 8400}]
    assert document["since"] == "2026-12-01T11:00:00+00:00"
    with pytest.raises(ValueError, match="end after it starts"):
        AuditWindow(since=NOW, until=NOW)
    with pytest.raises(ValueError, match="timezone-aware"):
        AuditWindow(since=datetime(2026, 1, 1), until=NOW)


def test_the_command_reads_times_and_durations() -> None:
    assert parse_moment("24h", now=NOW, option="--since") == NOW - timedelta(hours=24)
    assert parse_moment("PT90M", now=NOW, option="--since") == NOW - timedelta(minutes=90)
    assert parse_moment("2026-11-30T08:00:00", now=NOW, option="--since") == datetime(
        2026, 11, 30, 8, tzinfo=UTC
    )
    assert parse_duration("0", option="--in-flight-grace") == timedelta(0)
    with pytest.raises(CommandFailed, match="neither a time"):
        parse_moment("yesterday", now=NOW, option="--since")
    with pytest.raises(CommandFailed, match="not a duration"):
        parse_duration("soon", option="--in-flight-grace")


# ── end to end: the command against the local provider and PostgreSQL ─────────────────


async def onceflow_audit(
    provider: RunningProvider, database: str, *arguments: str, **settings: str
) -> tuple[int, str, str]:
    """Run ``onceflow audit`` as an operator would (its own process, its configuration
    from the environment); the provider keeps serving in this event loop meanwhile."""
    environment = {
        **os.environ,
        "DATABASE_URL": database,
        "STRIPE_API_BASE": provider.base_url,
        "STRIPE_API_KEY": API_KEY,
        "ONCEFLOW_STRIPE_ACCOUNT": ACCOUNT,
        **settings,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "onceflow.cli",
        "audit",
        *arguments,
        cwd=REPO,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def window_around(started: datetime) -> tuple[str, str, str, str]:
    until = datetime.now(UTC) + timedelta(minutes=1)
    return "--since", (started - timedelta(minutes=1)).isoformat(), "--until", until.isoformat()


async def test_the_audit_reports_exactly_a_planted_duplicate_orphan_and_missing_charge(
    charge: Charge,
    payment_provider: StripePaymentProvider,
    pool: AsyncConnectionPool,
    control: ProviderControl,
    provider: RunningProvider,
    database: str,
) -> None:
    started = datetime.now(UTC)
    charged = {task: await charge(task) for task in ("task-a", "task-b", "task-c", "task-d")}
    refund = tool_activities(REFUND_PAYMENT, pool, payment_provider)[0]
    refunded = await attempt_environment().run(
        refund,
        step_call("task-a", "back", "refund_payment", {"charge_step": "pay", "amount": 700}),
    )
    assert refunded.outcome is OutcomeClass.SUCCEEDED

    # A duplicate: task-b's operation charged again under another key (as a retry with
    # a fresh key would), carrying the same operation metadata.
    [first] = [e for e in await control.ledger() if e.object_id == charged["task-b"]]
    duplicate = await payment_provider.create_payment_intent(
        ChargeRequest(
            amount=4200,
            currency="eur",
            customer="cus_alice",
            payment_method="pm_card_visa",
            description="order ord-1001",
            metadata=first.metadata,
        ),
        idempotency_key="a-second-key-for-task-b",
    )
    # An orphan: a charge for an operation no step ever began.
    never_begun = key_digest(
        derive_child_key(
            tenant=TENANT,
            workflow_id="task-never-begun",
            step_id="pay",
            child_op="charge",
            provider_account=ACCOUNT,
        )
    )
    orphan = await payment_provider.create_payment_intent(
        ChargeRequest(
            amount=990,
            currency="usd",
            customer="cus_bob",
            payment_method="pm_card_visa",
            description="by hand",
            metadata={"onceflow_operation": never_begun},
        ),
        idempotency_key="by-hand",
    )
    # Missing: task-c's charge succeeded and was recorded; the provider no longer has it.
    assert await control.forget(charged["task-c"]) == [
        charged["task-c"],
        *[e.charge for e in await control.ledger() if e.object_id == charged["task-c"]],
    ]
    # Not onceflow's (no operation metadata), and a declined attempt: neither counts.
    await payment_provider.create_payment_intent(
        ChargeRequest(
            amount=1,
            currency="eur",
            customer="cus_carol",
            payment_method="pm_card_visa",
            description="someone else's",
        ),
        idempotency_key="not-onceflows",
    )

    code, out, err = await onceflow_audit(provider, database, *window_around(started), "--json")
    assert code == FINDINGS_EXIT_CODE, err
    report = json.loads(out)
    found = sorted(
        (f["kind"], tuple(f["resource_ids"]), f["workflow_id"]) for f in report["findings"]
    )
    assert found == [
        ("duplicate", (charged["task-b"], duplicate.id), "task-b"),
        ("missing", (charged["task-c"],), "task-c"),
        ("orphan", (orphan.id,), None),
    ]
    assert report["counts"] == {"duplicate": 1, "orphan": 1, "missing": 1}
    assert report["totals"] == [
        {"kind": "charge", "currency": "eur", "count": 4, "amount": 4 * 4200},
        {"kind": "charge", "currency": "usd", "count": 1, "amount": 990},
        {"kind": "refund", "currency": "eur", "count": 1, "amount": 700},
    ]
    assert report["operations_read"] == 5

    # For people: a table with the same three findings, the same exit code.
    code, out, err = await onceflow_audit(provider, database, *window_around(started))
    assert code == FINDINGS_EXIT_CODE, err
    for shown in ("duplicate", "orphan", "missing", duplicate.id, orphan.id, charged["task-c"]):
        assert shown in out
    assert "findings: 1 duplicate, 1 orphan, 1 missing" in out

    # Only list reads reached the provider (and one read by id, of the forgotten charge).
    reads = [(r.method, r.path) for r in await control.requests() if r.method == "GET"]
    assert ("GET", f"/v1/payment_intents/{charged['task-c']}") in reads
    assert not [path for _, path in reads if path.endswith("/search")]


async def test_a_clean_window_of_a_thousand_tasks_reports_nothing_and_exits_0(
    charge: Charge, provider: RunningProvider, database: str
) -> None:
    started = datetime.now(UTC)
    tasks = [f"task-{number:04d}" for number in range(1000)]
    gate = asyncio.Semaphore(16)

    async def one(task: str) -> str:
        async with gate:
            return await charge(task, amount=100 + int(task[-4:]))

    await asyncio.gather(*(one(task) for task in tasks))
    code, out, err = await onceflow_audit(provider, database, *window_around(started), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["clean"] and report["findings"] == []
    assert report["operations_read"] == report["effects_read"] == 1000
    assert report["totals"] == [
        {"kind": "charge", "currency": "eur", "count": 1000, "amount": sum(range(100, 1100))}
    ]


async def test_the_auditor_reports_its_progress_over_the_window(
    charge: Charge, payment_provider: StripePaymentProvider, pool: AsyncConnectionPool
) -> None:
    started = datetime.now(UTC)
    await charge("task-progress")
    seen: list[tuple[str, float]] = []
    report = await PaymentsAuditor(payment_provider, pool).audit(
        AuditWindow(since=started - timedelta(minutes=1), until=datetime.now(UTC)),
        progress=lambda what, done: seen.append((what, done)),
    )
    assert report.clean and report.totals[0].count == 1
    assert ("PaymentIntents", 1.0) in seen and ("refunds", 1.0) in seen
    assert all(0.0 <= done <= 1.0 for _, done in seen)


async def test_usage_errors_exit_2_and_an_unreadable_provider_exits_69_concluding_nothing(
    provider: RunningProvider, database: str, control: ProviderControl
) -> None:
    code, _, err = await onceflow_audit(provider, database, "--since", "yesterday")
    assert code == 2 and "neither a time" in err
    code, _, err = await onceflow_audit(provider, database, "--since", "1h", "--until", "2h")
    assert code == 2 and "--since must come before --until" in err
    code, _, err = await onceflow_audit(provider, database, "--since", "1h", "--family", "email")
    assert code == 2
    code, _, err = await onceflow_audit(provider, database, "--since", "1h", STRIPE_API_KEY="")
    assert code == 2 and "STRIPE_API_KEY is not set" in err
    await control.add_fault(Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents")
    code, out, err = await onceflow_audit(provider, database, "--since", "1h", "--json")
    assert code == 69 and out == ""
    assert "the audit concludes nothing" in err
