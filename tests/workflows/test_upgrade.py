"""A release upgrade as docs/production.md ("Ship a workflow change") tells it: tasks
parked, awaiting approval and open on release N; release N+1's workers (a changed workflow
branch behind a patch, a tool whose input model and approval threshold changed) take over;
every old task is decided and finishes, by the policies it pinned, with no nondeterminism.

Release N+1's workflow is ``AgentTaskWorkflow`` with one more command at a task's start.
Behind ``workflow.patched`` the old tasks replay their old branch; without it (the
negative control) the same histories fail to replay.
"""

import dataclasses
import uuid
from datetime import timedelta
from decimal import Decimal

from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker
from temporalio.workflow import NondeterminismError

from onceflow.plugin import OnceflowPlugin
from onceflow.retry_policy import OutcomeClass
from onceflow.task_api import TaskClient
from onceflow.tools import ApprovalThreshold
from onceflow.tools.worker import Catalogue
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    CallInput,
    OpenTaskOptions,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    StepState,
    TaskState,
    TaskStatus,
)
from tests.harness import OTHER_RELEASES, eventually

from .scripted_tools import NEEDS_APPROVAL, SAFE, UNSAFE, Script, ScriptedInput

NEXT_RELEASE_PATCH = "test-next-release-waits-a-moment-at-start"


async def _next_release_start() -> None:
    await workflow.sleep(timedelta(milliseconds=1), summary="release N+1's new first step")


class NextScriptedInput(ScriptedInput):
    """Release N+1's input model: a new field, with a default, as docs/production.md asks."""

    currency: str = "usd"


NEXT_APPROVAL = dataclasses.replace(
    NEEDS_APPROVAL,
    input_model=NextScriptedInput,
    approval_threshold=ApprovalThreshold(argument="amount", above=Decimal(1000)),
    version="2",
)
"""Release N+1's approval tool: a new input model, approval only above 1,000 (was 100)."""
NEXT_RELEASE_TOOLS = Catalogue((SAFE, UNSAFE, NEXT_APPROVAL))
"""Release N+1's catalogue: what its processes register."""


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class NextRelease(AgentTaskWorkflow):
    """Release N+1: its new first command ships behind a patch; its workers know
    release N+1's tools."""

    catalogue = NEXT_RELEASE_TOOLS

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        if workflow.patched(NEXT_RELEASE_PATCH):
            await _next_release_start()
        return await super().run(task)


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class NextReleaseUnguarded(AgentTaskWorkflow):
    """The same change shipped without its patch: what the patch protects old tasks from."""

    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        await _next_release_start()
        return await super().run(task)


async def test_release_n_plus_1_takes_over_parked_waiting_and_open_tasks_and_finishes_them(
    dev_server: WorkflowEnvironment,
    task_queue: str,
    script: Script,
) -> None:
    client = dev_server.client
    release_n = TaskClient(client, task_queue=task_queue)

    def plan(step: StepInput) -> AgentTaskInput:
        return AgentTaskInput(tenant="acme", principal="agent-1", steps=[step])

    async def state_of(workflow_id: str) -> TaskState:
        status = await client.get_workflow_handle(workflow_id).query(AgentTaskWorkflow.status)
        return status.state

    ids = {name: f"upgrade-{name}-{uuid.uuid4().hex[:8]}" for name in ("parked", "gated", "open")}
    async with Worker(
        client, task_queue=task_queue, workflows=[AgentTaskWorkflow], activities=script.activities()
    ):
        await release_n.start(
            plan(
                StepInput(
                    step_id="p",
                    tool=UNSAFE.name,
                    arguments={
                        "label": script.plan("up", OutcomeClass.UNKNOWN, OutcomeClass.SUCCEEDED)
                    },
                )
            ),
            workflow_id=ids["parked"],
        )
        await release_n.start(
            plan(
                StepInput(
                    step_id="g", tool=NEEDS_APPROVAL.name, arguments={"label": "ug", "amount": 900}
                )
            ),
            workflow_id=ids["gated"],
        )
        await release_n.start(
            AgentTaskInput(tenant="acme", principal="agent-1", open=OpenTaskOptions()),
            workflow_id=ids["open"],
        )
        first = await release_n.call(
            ids["open"], CallInput(call_id="c1", tool=SAFE.name, arguments={"label": "uo1"})
        )
        assert first.call.state is StepState.SUCCEEDED
        for name, state in (("parked", TaskState.PARKED), ("gated", TaskState.AWAITING_APPROVAL)):
            await eventually(
                lambda name=name: state_of(ids[name]),
                until=lambda seen, state=state: seen is state,
                what=f"the {name} task on release N",
            )
    release_n_histories = {
        name: await client.get_workflow_handle(workflow_id).fetch_history()
        for name, workflow_id in ids.items()
    }

    # Release N+1: its processes carry the new contract; its workers cache nothing, so
    # every workflow task of an old task replays that task's whole history.
    next_client = TaskClient(client, task_queue=task_queue, catalogue=NEXT_RELEASE_TOOLS)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[NextRelease],
        activities=script.activities(NEXT_RELEASE_TOOLS),
        max_cached_workflows=0,
    ):
        gated = client.get_workflow_handle(ids["gated"])
        waiting = await gated.query(AgentTaskWorkflow.status)
        # Pinned on release N: 900 still needs approval, although N+1 asks only above 1,000.
        assert waiting.policies[NEEDS_APPROVAL.name].approval_above == Decimal(100)
        await gated.execute_update(
            AgentTaskWorkflow.approve,
            ApproveInput(
                step_id="g",
                approved=True,
                approver="cfo",
                reason="fine",
                arguments_digest=waiting.step("g").arguments_digest,
            ),
        )
        await client.get_workflow_handle(ids["parked"]).execute_update(
            AgentTaskWorkflow.reconcile,
            ReconcileInput(
                step_id="p",
                decision=ReconcileDecision.DID_NOT_HAPPEN,
                operator="ops",
                reason="checked the far side",
            ),
        )
        # The open task takes a call in N+1's input model (its new field), then closes.
        later = await next_client.call(
            ids["open"],
            CallInput(
                call_id="c2",
                tool=NEXT_APPROVAL.name,
                arguments={"label": "uo2", "amount": 900, "currency": "eur"},
            ),
        )
        assert later.call.state is StepState.SUCCEEDED  # N+1's threshold, pinned by its call
        await next_client.close(ids["open"])
        # A new task on N+1 decides by N+1's policy: 900 runs without approval.
        new_id = f"upgrade-new-{uuid.uuid4().hex[:8]}"
        OTHER_RELEASES[new_id] = NextRelease  # the end-of-run replay knows its release
        await next_client.start(
            plan(
                StepInput(
                    step_id="g",
                    tool=NEXT_APPROVAL.name,
                    arguments={"label": "un", "amount": 900, "currency": "eur"},
                )
            ),
            workflow_id=new_id,
        )
        new = await next_client.result(new_id)
        results = {name: await next_client.result(workflow_id) for name, workflow_id in ids.items()}

    assert new.state is TaskState.SUCCEEDED and new.decisions == []  # no approval asked
    assert {name: status.state for name, status in results.items()} == {
        "parked": TaskState.SUCCEEDED,
        "gated": TaskState.SUCCEEDED,
        "open": TaskState.CLOSED,
    }
    assert [call.state for call in results["open"].steps] == [StepState.SUCCEEDED] * 2
    # The far side performed each old effect once, after its decision, on release N+1.
    assert script.attempts("up") == 2 and script.attempts("ug") == 1
    assert script.calls["uo2"][0].arguments["currency"] == "eur"

    # Whole histories, old tasks and the new one, replay on N+1; the old ones do not
    # replay on N+1 shipped without its patch.
    ended = {
        name: await client.get_workflow_handle(workflow_id).fetch_history()
        for name, workflow_id in {**ids, "new": new_id}.items()
    }
    assert patch_markers(ended["new"]) == [NEXT_RELEASE_PATCH]
    assert all(
        NEXT_RELEASE_PATCH not in patch_markers(history)
        for name, history in ended.items()
        if name != "new"
    )
    for history in ended.values():
        assert await replay_failure(NextRelease, history) is None, history.workflow_id
    for name, history in release_n_histories.items():
        failure = await replay_failure(NextReleaseUnguarded, history)
        assert isinstance(failure, NondeterminismError), (name, failure)


async def replay_failure(workflow_class: type, history: WorkflowHistory) -> Exception | None:
    replayer = Replayer(
        workflows=[], plugins=[OnceflowPlugin(workflows=[workflow_class], strict_sandbox=True)]
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


def patch_markers(history: WorkflowHistory) -> list[str]:
    """The patch ids a history's markers record."""
    import json

    found = []
    for event in history.events:
        if event.HasField("marker_recorded_event_attributes"):
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_patch":
                [payload] = marker.details["patch-data"].payloads
                found.append(json.loads(payload.data)["id"])
    return found
