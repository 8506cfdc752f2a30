"""A task whose workflow task fails on every worker (a release shipped without the patch
its change needed): the gateway answers its status with the documented 503
``task-unanswered``, naming the failure, never a 500; the task itself is untouched."""

import uuid
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.errors import TaskUnanswered
from onceflow.gateway import GatewaySettings, open_boundary
from onceflow.settings import OnceflowSettings
from onceflow.task_api import TaskClient
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    StepInput,
    TaskState,
    TaskStatus,
)
from tests.harness import eventually
from tests.payments.test_worker_crash import operator_of

from .scripted_tools import NEEDS_APPROVAL, Script


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class UnguardedRelease(AgentTaskWorkflow):
    """A new first command shipped without a patch: every old task's replay diverges."""

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        await workflow.sleep(timedelta(milliseconds=1))
        return await super().run(task)


async def test_a_task_whose_workflow_task_fails_answers_503_task_unanswered(
    dev_server: WorkflowEnvironment, database: str, task_queue: str, script: Script
) -> None:
    client = dev_server.client
    tasks = TaskClient(client, task_queue=task_queue)
    workflow_id = f"failing-{uuid.uuid4().hex[:8]}"
    step = StepInput(step_id="g", tool=NEEDS_APPROVAL.name, arguments={"label": "f", "amount": 900})
    async with Worker(
        client, task_queue=task_queue, workflows=[AgentTaskWorkflow], activities=script.activities()
    ):
        await tasks.start(
            AgentTaskInput(tenant="acme", principal="agent", steps=[step]), workflow_id=workflow_id
        )
        await eventually(
            lambda: tasks.status(workflow_id),
            until=lambda status: status.state is TaskState.AWAITING_APPROVAL,
            what="the task awaits approval",
            timeout=120,
        )
    handle = client.get_workflow_handle(workflow_id)
    async with (
        Worker(
            client,
            task_queue=task_queue,
            workflows=[UnguardedRelease],
            activities=script.activities(),
            max_cached_workflows=0,
        ),
        open_boundary(
            OnceflowSettings(task_queue=task_queue),
            GatewaySettings(),
            database_url=database,
            temporal_address=client.service_client.config.target_host,
        ) as service,
    ):
        await handle.signal(AgentTaskWorkflow.starter_stopped_waiting)  # a workflow task

        async def failed() -> bool:
            return any(
                [
                    event
                    async for event in handle.fetch_history_events()
                    if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                ]
            )

        await eventually(failed, what="the new worker's workflow task fails", timeout=120)
        with pytest.raises(TaskUnanswered) as unanswered:
            await service.task_status(operator_of("acme"), workflow_id)
    assert unanswered.value.status == 503
    assert "its workflow task fails (attempt " in unanswered.value.detail
    await handle.terminate("test over")
