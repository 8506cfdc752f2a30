"""Whether an answer is a replay depends on who started the task, not on when the gateway
looked: a one-step task can end between its start and the gateway's first look at it, and
its first answer is still not a replay (the Idempotent-Replayed header is then absent)."""

from typing import Any

from temporalio.client import WorkflowHandle

from onceflow.gateway import BoundaryService, GatewaySettings, PrincipalStore
from onceflow.idempotency import IdempotencyStore
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.workflows.task_models import AgentTaskInput

from .conftest import Caller, Stack, count

COUPON = {"user_id": "u-quick", "coupon_id": "WELCOME10"}


class EndingBeforeLookedAt(TaskClient):
    """A task client whose started tasks have ended by the time ``start`` returns: the
    widest the race between a quick task and the gateway's look at it can be."""

    async def start(
        self, task: AgentTaskInput, *, workflow_id: str, memo: Any = None, join: bool = True
    ) -> WorkflowHandle[Any, Any]:
        handle = await super().start(task, workflow_id=workflow_id, memo=memo, join=join)
        await handle.result()
        return handle


async def test_a_task_that_ended_before_the_gateway_looked_is_not_answered_as_a_replay(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with build_pool(stack.postgres_url, max_size=4) as pool:
        service = BoundaryService(
            principals=PrincipalStore(pool),
            records=IdempotencyStore(pool),
            tasks=EndingBeforeLookedAt(stack.client, task_queue=stack.task_queue),
            settings=GatewaySettings(),
        )
        first = await service.call_tool(agent.principal, "issue_coupon", COUPON, "quick-0001")
        again = await service.call_tool(agent.principal, "issue_coupon", COUPON, "quick-0001")
    assert first.status_code == 200 and first.body["state"] == "succeeded"
    assert first.replayed is False
    assert again.replayed is True and again.body == first.body
    assert count(database, "coupon_issuances") == 1
