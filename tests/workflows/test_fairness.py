"""Flow control per tenant and provider, on the real dev server (fairness on, as ``onceflow
dev`` runs it): every task and the tool activities it schedules are queued under the
task's tenant as fairness key, and the worker holds its task queue to the activity rate
it was configured with, or else to the slowest rate its tools' providers document."""

import uuid
from collections.abc import Sequence

from temporalio.api.enums.v1 import RateLimitSource, TaskQueueType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeTaskQueueResponse,
)
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.coupons import coupon_tools
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.worker import build_worker, task_queue_rate_limit
from onceflow.workflows.task_models import (
    AgentTaskInput,
    CallInput,
    OpenTaskOptions,
    StepInput,
    StepState,
    TaskState,
)
from tests.harness import eventually
from tests.tool_configuration import builtin

ORDER = {
    "currency": "usd",
    "lines": [{"sku": "tee-black", "quantity": 1, "unit_price_cents": 1500}],
}


async def test_a_task_and_its_tool_activities_are_queued_under_its_tenant(
    dev_server: WorkflowEnvironment, postgres_url: str, task_queue: str
) -> None:
    client = dev_server.client
    tasks = TaskClient(client, task_queue=task_queue)
    plan_id, open_id = f"fair-plan-{uuid.uuid4().hex}", f"fair-open-{uuid.uuid4().hex}"
    async with (
        build_pool(postgres_url, max_size=2) as pool,
        build_worker(client, pool, OnceflowSettings(task_queue=task_queue), tools=builtin()),
    ):
        await tasks.start(
            AgentTaskInput(
                tenant="acme",
                principal="agent-1",
                steps=[
                    StepInput(
                        step_id="order",
                        tool="create_order",
                        arguments={**ORDER, "customer_id": f"c-{uuid.uuid4().hex[:8]}"},
                    )
                ],
            ),
            workflow_id=plan_id,
        )
        # An open task is started by its first call (Update-with-Start).
        answer = await tasks.call(
            open_id,
            CallInput(
                call_id="coupon",
                tool="issue_coupon",
                arguments={"user_id": f"u-{uuid.uuid4().hex[:8]}", "coupon_id": "WELCOME"},
                wait_until_ended=True,
            ),
            start=AgentTaskInput(tenant="globex", principal="agent-2", open=OpenTaskOptions()),
        )
        assert answer.call.state is StepState.SUCCEEDED
        await tasks.close(open_id)
        assert (await tasks.result(plan_id)).state is TaskState.SUCCEEDED
        assert (await tasks.result(open_id)).state is TaskState.CLOSED

    for workflow_id, tenant, tool in (
        (plan_id, "acme", "create_order"),
        (open_id, "globex", "issue_coupon"),
    ):
        events = await _history(client, workflow_id)
        started = events[0].workflow_execution_started_event_attributes
        assert started.priority.fairness_key == tenant
        attempts = [
            event.activity_task_scheduled_event_attributes
            for event in events
            if event.HasField("activity_task_scheduled_event_attributes")
            and event.activity_task_scheduled_event_attributes.activity_type.name == tool
        ]
        assert attempts, f"{workflow_id} scheduled no {tool} attempt"
        assert {attempt.priority.fairness_key for attempt in attempts} == {tenant}


async def test_the_worker_holds_its_task_queue_to_the_configured_activity_rate(
    dev_server: WorkflowEnvironment, postgres_url: str, task_queue: str
) -> None:
    settings = OnceflowSettings(task_queue=task_queue, task_queue_activities_per_second=7.5)
    async with (
        build_pool(postgres_url, max_size=2) as pool,
        build_worker(dev_server.client, pool, settings, tools=coupon_tools()),
    ):
        limit = await _effective_limit(
            dev_server.client, task_queue, RateLimitSource.RATE_LIMIT_SOURCE_WORKER
        )
    assert limit.requests_per_second == 7.5


def test_the_rate_limit_is_the_setting_and_none_unless_set() -> None:
    # Opt-in: a limit holds every tool's activities and turns eager starts off.
    assert task_queue_rate_limit(None) is None
    assert task_queue_rate_limit(12.5) == 12.5
    assert task_queue_rate_limit(0) is None  # 0: the limit is off


async def _effective_limit(
    client: Client, task_queue: str, source: "RateLimitSource.ValueType"
) -> "DescribeTaskQueueResponse.EffectiveRateLimit":
    """The activity rate limit the server applies to ``task_queue``, once it comes from
    ``source`` (a worker's limit arrives with its first activity poll)."""

    async def described() -> DescribeTaskQueueResponse:
        return await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
                report_config=True,
            )
        )

    response = await eventually(
        described,
        what=f"the server reports the activity rate limit of {task_queue} set by {source}",
        until=lambda response: response.effective_rate_limit.rate_limit_source == source,
    )
    return response.effective_rate_limit


async def _history(client: Client, workflow_id: str) -> Sequence[HistoryEvent]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return history.events
