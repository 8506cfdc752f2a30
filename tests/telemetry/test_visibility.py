"""The Temporal server's visibility API finds exactly the parked tasks by search attribute.

Tasks come in through the gateway (as tasks, for a fast budget): two charges whose
provider commits, answers 500 and whose search lags (they park) and a coupon (it
succeeds). The query operators type into
the Temporal UI, ``OnceflowState = "parked"``, must return those two and nothing else,
each with the time it parked; once one is decided it drops out.
"""

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import httpx
from onceflow_devstack.stripe_provider import Fault
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import WorkflowExecutionStatus

from onceflow.telemetry import PARKED_QUERY, scan_parked_tasks
from onceflow.workflows.agent_task import TRACE_ID_MEMO
from onceflow.workflows.task_models import ReconcileDecision, ReconcileInput, TaskState
from onceflow.workflows.visibility import TASK_PARKED_AT, TASK_STATE
from tests.harness import HANG_SECONDS, eventually
from tests.payments.conftest import FAST_BUDGET, VISA_CHARGE

from .conftest import TelemetryStack

T = TypeVar("T")


async def settled(read: Callable[[], Awaitable[T]], want: T, *, timeout: float = HANG_SECONDS) -> T:
    """Read until the visibility store (eventually consistent) answers ``want``."""
    return await eventually(
        read,
        until=lambda got: got == want,
        what=f"visibility answers {want!r}",
        timeout=timeout,
        interval=0.1,
    )


async def test_the_state_search_attribute_finds_exactly_the_parked_tasks(
    stack: TelemetryStack, http: httpx.AsyncClient
) -> None:
    began = datetime.now(UTC)
    tenant, auth = await stack.new_agent(tools=("charge_payment", "issue_coupon"))
    await stack.control.configure(search_lag_seconds=3600)
    await stack.control.add_fault(
        Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/payment_intents", times=None
    )
    # ... and the charges cannot be read back (list, search): the look-ups prove nothing.
    await stack.control.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/payment_intents", times=None
    )

    async def call(tool: str, arguments: dict[str, object]) -> str:
        answer = await http.post(
            f"{stack.gateway_url}/v1/tasks",
            json={
                "steps": [{"step_id": "1", "tool": tool, "arguments": arguments}],
                "budget": FAST_BUDGET.model_dump(mode="json"),
            },
            headers={**auth, "Idempotency-Key": uuid.uuid4().hex},
        )
        assert answer.status_code in (200, 202), answer.text
        return str(answer.json()["task_id"])

    try:
        parked_ids = set(
            await asyncio.gather(
                call("charge_payment", VISA_CHARGE),
                call("charge_payment", {**VISA_CHARGE, "order_id": "ord-2002"}),
            )
        )
        for task_id in parked_ids:
            await stack.wait_for_state(task_id, lambda s: s.state is TaskState.PARKED)
    finally:
        await stack.control.clear_faults()
        await stack.control.configure(search_lag_seconds=0)
    coupon = await call("issue_coupon", {"user_id": "u-7", "coupon_id": "WELCOME10"})
    assert (await stack.tasks.result(coupon)).state is TaskState.SUCCEEDED

    query = f"{PARKED_QUERY} AND OnceflowTenant = '{tenant}'"

    async def parked_now() -> set[str]:
        return {execution.id async for execution in stack.client.list_workflows(query)}

    assert await settled(parked_now, parked_ids) == parked_ids
    listed = {
        task.workflow_id async for task in stack.tasks.list(state=TaskState.PARKED, tenant=tenant)
    }
    assert listed == parked_ids
    everything = [
        execution async for execution in stack.client.list_workflows(f"OnceflowTenant = '{tenant}'")
    ]
    assert {execution.id for execution in everything} == parked_ids | {coupon}
    for execution in everything:
        attributes = execution.typed_search_attributes
        parked_at = attributes.get(TASK_PARKED_AT)
        if execution.id in parked_ids:
            assert attributes.get(TASK_STATE) == "parked"
            assert parked_at is not None
            assert began - timedelta(seconds=1) <= parked_at <= datetime.now(UTC)  # this test
        else:
            # Its end is its close status (since 0.6.0): left at running, listed succeeded.
            assert attributes.get(TASK_STATE) == "running"
            assert execution.status is WorkflowExecutionStatus.COMPLETED
            assert parked_at is None
    succeeded = {
        task.workflow_id: task.state
        async for task in stack.tasks.list(state=TaskState.SUCCEEDED, tenant=tenant)
    }
    assert succeeded == {coupon: "succeeded"}
    count, oldest = await scan_parked_tasks(stack.client)
    assert count >= 2 and oldest is not None

    # What the UI shows for a parked task: its evidence, the reconcile command, the trace.
    first, second = sorted(parked_ids)
    metadata = await stack.client.get_workflow_handle(first).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    details = metadata.current_details
    described = await stack.client.get_workflow_handle(first).describe()
    # A stored 500: its replayed repeat, then the look-up, then the park (#13), not the
    # whole budget.
    assert details.startswith("Parked at step 1 (charge_payment): Stripe answered HTTP 500")
    assert "- child_key_digest: sha256:" in details
    assert "- lookup_list: the list could not be read" in details
    assert f"`onceflow reconcile {first} --step 1 --decision happened|" in details
    assert f"Trace: `{(await described.memo())[TRACE_ID_MEMO]}`" in details
    assert await described.static_summary() == f"{tenant}: charge_payment"

    # A decided task leaves the parked set and loses its parked-at time.
    await stack.tasks.reconcile(
        first,
        ReconcileInput(
            step_id="1",
            decision=ReconcileDecision.ABANDON,
            operator="ops",
            reason="customer cancelled",
        ),
    )
    assert await settled(parked_now, {second}) == {second}
    [decided] = [
        execution async for execution in stack.client.list_workflows(f"WorkflowId = '{first}'")
    ]
    assert decided.typed_search_attributes.get(TASK_PARKED_AT) is None
    await stack.tasks.reconcile(
        second,
        ReconcileInput(
            step_id="1",
            decision=ReconcileDecision.ABANDON,
            operator="ops",
            reason="customer cancelled",
        ),
    )
