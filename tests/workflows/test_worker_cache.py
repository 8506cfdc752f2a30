"""A worker's memory is bounded by its task cache (``ONCEFLOW_MAX_CACHED_TASKS``): tasks past
it are evicted, and a decision still wakes each of them, replayed from its history."""

import uuid

from temporalio.testing import WorkflowEnvironment

from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools.worker import arguments_digest
from onceflow.worker import build_worker
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    StepInput,
    StepState,
    TaskState,
)
from onceflow.workflows.visibility import TASK_STATE
from tests.harness import eventually
from tests.tool_configuration import builtin

DEPLOYMENT = {"service": "checkout", "version": "1.2.3", "environment": "staging"}


async def test_a_worker_caching_one_task_still_wakes_each_of_three_waiting_ones(
    dev_server: WorkflowEnvironment, postgres_url: str, task_queue: str
) -> None:
    settings = OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1, max_cached_tasks=1)
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    ids = [f"cache-{uuid.uuid4().hex}" for _ in range(3)]
    async with (
        build_pool(postgres_url, max_size=2) as pool,
        build_worker(dev_server.client, pool, settings, tools=builtin()) as worker,
    ):
        assert worker.config()["max_cached_workflows"] == 1
        for workflow_id in ids:
            await tasks.start(
                AgentTaskInput(
                    tenant="acme",
                    principal="deployer",
                    steps=[
                        StepInput(step_id="ship", tool="start_deployment", arguments=DEPLOYMENT)
                    ],
                ),
                workflow_id=workflow_id,
            )

            async def awaiting(workflow_id: str = workflow_id) -> bool:
                described = await dev_server.client.get_workflow_handle(workflow_id).describe()
                return described.typed_search_attributes.get(TASK_STATE) == "awaiting_approval"

            await eventually(awaiting, what=f"{workflow_id} awaits approval")
        # Each task's first workflow task ran after the one before: only the last is cached.
        for workflow_id in ids:
            await tasks.approve(
                workflow_id,
                ApproveInput(
                    step_id="ship",
                    approved=False,
                    approver="ops",
                    reason="not today",
                    arguments_digest=arguments_digest("start_deployment", DEPLOYMENT),
                ),
            )
            ended = await tasks.result(workflow_id)
            assert ended.state is TaskState.FAILED
            assert ended.steps[0].state is StepState.DENIED
