"""A call whose coroutine raises (a bug in the workflow's own code, a worker without the
tool) is visible: the open task's workflow task fails with the cause, and Temporal
retries it (after a fix, on a worker with the tool), instead of the call staying
``running`` with its Update never answered."""

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from onceflow.task_api import TaskClient
from onceflow.tools.worker import ToolPolicy
from onceflow.workflows.task_models import AgentTaskInput, CallInput, OpenTaskOptions
from tests.harness import eventually

from .conftest import scripted_worker
from .scripted_tools import SAFE, Script


class InjectedBug(RuntimeError):
    """Raised where the workflow asks whether a call needs approval."""


def buggy_needs_approval(policy: ToolPolicy, args: object) -> bool:
    raise InjectedBug("injected bug: deciding whether the call needs approval")


async def test_a_call_whose_coroutine_raises_fails_the_workflow_task_with_its_cause(
    dev_server: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tasks = TaskClient(dev_server.client, task_queue=task_queue)
    workflow_id = f"crash-{uuid.uuid4().hex}"
    handle = dev_server.client.get_workflow_handle(workflow_id)

    async def failures() -> list[str]:
        return [
            event.workflow_task_failed_event_attributes.failure.message
            async for event in handle.fetch_history_events()
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        ]

    async with scripted_worker(dev_server, task_queue, script):
        await tasks.start(
            AgentTaskInput(tenant="acme", principal="agent-1", open=OpenTaskOptions()),
            workflow_id=workflow_id,
        )
        monkeypatch.setattr(ToolPolicy, "needs_approval", buggy_needs_approval)
        call = CallInput(call_id="c1", tool=SAFE.name, arguments={"label": "bug"})
        waiting = asyncio.create_task(tasks.call(workflow_id, call))
        try:
            failed = await eventually(failures, what="the task's workflow task failed", timeout=60)
            assert "injected bug" in failed[0], failed
            assert script.attempts("bug") == 0  # the bug came before the attempt
            assert not waiting.done()  # never answered as if the call had run
        finally:
            waiting.cancel()
            await handle.terminate("test over")
