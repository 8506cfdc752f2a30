"""Who may decide what, over the HTTP API an app's approval screen uses: an approver
(``onceflow principal add --approvals``) approves and denies its tenant's steps but never
reconciles a parked one; an agent's key decides nothing. Checked where it matters: the
provider's ledger and the decisions the task recorded.
"""

from typing import Any

import httpx
import pytest
from onceflow_client import OnceflowClient, OpenTask, PermissionDenied
from onceflow_devstack.stripe_provider import Fault, ProviderControl

from tests.gateway.conftest import Caller
from tests.harness import HANG_SECONDS

from .conftest import FAST_BUDGET, AgentStack, new_order_id

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]


def charge(order_id: str) -> dict[str, Any]:
    return {
        "amount": 3000,
        "currency": "usd",
        "customer": "cus_carol",
        "payment_method": "pm_card_visa",
        "order_id": order_id,
    }


def step(status: dict[str, Any], step_id: str) -> dict[str, Any]:
    [found] = [s for s in status["steps"] if s["step_id"] == step_id]
    return found


@pytest.fixture
async def agent(agent_stack: AgentStack) -> Caller:
    return await agent_stack.agent()


async def test_an_approver_approves_a_refund_but_may_not_reconcile_and_an_agent_may_not_approve(
    agent_stack: AgentStack, agent: Caller, behaving_provider: ProviderControl
) -> None:
    far_sides = agent_stack.far_sides
    approver = await agent_stack.approver(agent)
    async with (
        OnceflowClient(agent_stack.gateway_url, api_key=agent.api_key) as onceflow,
        OnceflowClient(agent_stack.gateway_url, api_key=approver.api_key) as screen,
        onceflow.open_task(budget=FAST_BUDGET) as task,
    ):
        parked_pi, waiting_pi = await charged(task, "pay-1"), await charged(task, "pay-2")
        # The provider refunds, answers 500 and keeps it, and cannot be read back: parked.
        await behaving_provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds")
        await behaving_provider.add_fault(
            Fault.ERROR_503, method="GET", path_prefix="/v1/refunds", times=None
        )
        parked = await task.call("refund_payment", {"charge_step": "pay-1", "amount": 500})
        await behaving_provider.clear_faults()
        waiting = await task.call("refund_payment", {"charge_step": "pay-2"})  # in full
        assert (parked.state, waiting.state) == ("parked", "awaiting_approval")
        [committed] = await far_sides.refunds(parked_pi)

        with pytest.raises(PermissionDenied) as agents_approval:
            await onceflow.approve(
                task.task_id,
                waiting.step_id,
                approved=True,
                reason="the agent approving itself",
                arguments_digest=waiting.body["arguments_digest"],
            )
        # The client has no reconcile (an operator's work): the screen tries it by hand.
        async with httpx.AsyncClient(
            base_url=agent_stack.gateway_url, headers=approver.headers
        ) as http:
            reconciliation = await http.post(
                f"/v1/tasks/{task.task_id}/reconcile",
                json={"step_id": parked.step_id, "decision": "did_not_happen", "reason": "!"},
                timeout=60,
            )
        refused = await task.status()

        await screen.approve(
            task.task_id,
            waiting.step_id,
            approved=True,
            reason="the customer returned everything",
            arguments_digest=waiting.body["arguments_digest"],
        )
        ended = await task.wait(waiting, timeout=HANG_SECONDS)
        decided = await task.status()

    assert agents_approval.value.problem_type == "decisions-not-allowed"
    assert "may not approve or deny steps" in agents_approval.value.detail
    assert reconciliation.status_code == 403
    assert reconciliation.json()["type"].endswith(":decisions-not-allowed")
    assert "not reconcile parked ones" in reconciliation.json()["detail"]
    assert refused["decisions"] == []
    assert step(refused, parked.step_id)["state"] == "parked"
    assert step(refused, waiting.step_id)["state"] == "awaiting_approval"

    assert ended.succeeded
    [decision] = decided["decisions"]
    assert (decision["kind"], decision["decision"], decision["operator"]) == (
        "approve",
        "approve",
        approver.principal.name,
    )
    assert decision["arguments_digest"] == waiting.body["arguments_digest"]
    # The refused decisions changed nothing at the provider: the parked refund is the one
    # it committed, and the approved one refunded once.
    assert [r.object_id for r in await far_sides.refunds(parked_pi)] == [committed.object_id]
    [refunded] = await far_sides.refunds(waiting_pi)
    assert refunded.object_id == ended.result["refund"]


async def charged(task: OpenTask, step_id: str) -> str:
    answer = await task.call("charge_payment", charge(new_order_id()), call_id=step_id)
    assert answer.succeeded, answer.body
    return str(answer.result["payment_intent"])
