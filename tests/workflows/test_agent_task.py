"""AgentTaskWorkflow's policy on Temporal's time-skipping server.

The scripted tools decide how each attempt ends; everything else is real: the
workflow, its budget, its timers, updates and signals, and the Temporal server.
"""

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.retry_policy import OutcomeClass, RetryBudget
from onceflow.task_api import TaskClient
from onceflow.tools import ApprovalThreshold
from onceflow.tools.worker import (
    CATALOGUE,
    Catalogue,
    KeyUnusable,
    UnknownTool,
    arguments_digest,
)
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    AgentTaskInput,
    ApproveInput,
    CallInput,
    ReconcileDecision,
    ReconcileInput,
    StepInput,
    StepState,
    TaskState,
    TaskStatus,
)
from tests.harness import eventually

from .conftest import scripted_worker
from .scripted_tools import NEEDS_APPROVAL, SAFE, SCRIPTED_CONTRACTS, Script

S, R, T, U = (
    OutcomeClass.SUCCEEDED,
    OutcomeClass.REJECTED,
    OutcomeClass.TRANSIENT,
    OutcomeClass.UNKNOWN,
)
FAST_BUDGET = RetryBudget(
    max_attempts_per_task=5,
    max_attempts_per_step=3,
    initial_backoff=timedelta(seconds=1),
    max_backoff=timedelta(seconds=8),
)

Handle = WorkflowHandle[AgentTaskWorkflow, TaskStatus]


@pytest.fixture
async def worker(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script
) -> AsyncIterator[Worker]:
    async with scripted_worker(time_skipping_env, task_queue, script) as running:
        yield running


@pytest.fixture
async def own_worker(
    own_time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script
) -> AsyncIterator[Worker]:
    """The scripted worker on the test's own time-skipping server (for a test that sleeps)."""
    async with scripted_worker(own_time_skipping_env, task_queue, script) as running:
        yield running


async def start(
    env: WorkflowEnvironment,
    task_queue: str,
    *steps: tuple[str, str, dict[str, object]],
    budget: RetryBudget | None = FAST_BUDGET,
    catalogue: Catalogue = CATALOGUE,
) -> Handle:
    # Carries its tools' policies as TaskClient's tasks do; none with a tool nobody
    # catalogued (started by hand: TaskClient would refuse it, ``UnknownTool``).
    tools = [tool for _, tool, _ in steps]
    task = AgentTaskInput(
        tenant="acme",
        principal="agent-1",
        steps=[StepInput(step_id=sid, tool=tool, arguments=args) for sid, tool, args in steps],
        budget=budget,
        policies=catalogue.policies(tools) if all(t in catalogue for t in tools) else None,
    )
    return await env.client.start_workflow(
        AgentTaskWorkflow.run, task, id=f"task-{uuid.uuid4().hex}", task_queue=task_queue
    )


async def wait_until(
    env: WorkflowEnvironment,
    handle: Handle,
    done: Callable[[TaskStatus], bool],
    *,
    step: timedelta = timedelta(seconds=2),
) -> TaskStatus:
    """Poll the status query, skipping time between polls so timers fire."""
    for _ in range(300):
        status = await handle.query(AgentTaskWorkflow.status)
        if done(status):
            return status
        await env.sleep(step)  # skips Temporal's clock so the workflow's timers fire
    raise AssertionError(f"condition never held; last status: {status.model_dump_json()}")


def parked(status: TaskStatus) -> bool:
    return status.state is TaskState.PARKED


async def accepted_updates(handle: Handle) -> int:
    history = await handle.fetch_history()
    return sum(
        1
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    )


async def test_total_attempts_never_exceed_the_task_budget_across_steps(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    first = script.plan("b1", T, T, S)
    second = script.plan("b2", T, T, S)
    handle = await start(
        time_skipping_env,
        task_queue,
        ("one", "scripted_safe", {"label": first}),
        ("two", "scripted_safe", {"label": second}),
    )
    result = await handle.result()

    assert script.attempts(first) + script.attempts(second) == FAST_BUDGET.max_attempts_per_task
    assert (script.attempts(first), script.attempts(second)) == (3, 2)
    assert result.state is TaskState.FAILED
    assert result.step("one").state is StepState.SUCCEEDED
    assert result.step("two").state is StepState.FAILED
    assert "5 of 5 attempts per task" in (result.failure_reason or "")
    assert result.budget.attempts_used == 5 and result.budget.attempts_left == 0


async def test_per_step_cap_fails_a_step_that_only_saw_transient_outcomes(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("always-transient", T)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_safe", {"label": label}))
    result = await handle.result()

    assert script.attempts(label) == FAST_BUDGET.max_attempts_per_step
    assert result.state is TaskState.FAILED
    assert "attempts per step" in (result.failure_reason or "")


async def test_a_rejected_outcome_is_tried_once(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("rejected", R)
    handle = await start(
        time_skipping_env,
        task_queue,
        ("s1", "scripted_safe", {"label": label}),
        ("s2", "scripted_safe", {"label": "never-reached"}),
    )
    result = await handle.result()

    assert script.attempts(label) == 1
    assert script.attempts("never-reached") == 0
    assert result.state is TaskState.FAILED
    assert result.step("s1").attempts[0].outcome is OutcomeClass.REJECTED
    assert result.step("s2").state is StepState.PENDING


async def test_an_unknown_outcome_is_retried_when_the_strategy_makes_it_safe(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("safe-unknown", U, S)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_safe", {"label": label}))
    result = await handle.result()

    assert result.state is TaskState.SUCCEEDED
    assert script.attempts(label) == 2
    assert result.step("s").resource_id == f"res-{label}-2"


async def test_unknown_on_an_unsafe_tool_parks_and_never_retries_on_its_own(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("unsafe-unknown", U)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_unsafe", {"label": label}))
    status = await wait_until(time_skipping_env, handle, parked)
    await time_skipping_env.sleep(timedelta(hours=30))  # scenario: every timer due fires
    status = await handle.query(AgentTaskWorkflow.status)

    assert script.attempts(label) == 1
    assert status.state is TaskState.PARKED
    step = status.step("s")
    assert step.state is StepState.PARKED
    assert "not provably safe" in (step.park_reason or "")
    assert step.evidence == {"request_id": f"req-{label}-1"}
    assert step.reconcile_command is not None
    assert handle.id in step.reconcile_command


async def test_a_provider_keyed_tool_parks_once_the_provider_may_have_forgotten_the_key(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("keyed-unknown", U)
    # Caps far above what 23 hours of ≥10 h backoff caps can use, so only the key
    # retention can stop the repeats, whatever the jitter draws.
    patient = FAST_BUDGET.model_copy(
        update={
            "max_attempts_per_task": 100,
            "max_attempts_per_step": 100,
            "initial_backoff": timedelta(hours=10),
            "max_backoff": timedelta(hours=30),
            "deadline": timedelta(days=7),
        }
    )
    handle = await start(
        time_skipping_env, task_queue, ("s", "scripted_provider", {"label": label}), budget=patient
    )
    status = await wait_until(time_skipping_env, handle, parked, step=timedelta(hours=1))

    # Repeats with the same key happen only while the first attempt is younger than
    # retention (24 h) minus margin (1 h): a backoff longer than the whole window parks
    # at once; a shorter one that reaches past what is left ends when the key's window
    # closes, and the step parks then.
    attempts = status.step("s").attempts
    ages = [attempt.started_at - attempts[0].started_at for attempt in attempts]
    assert all(age < timedelta(hours=23) for age in ages)
    assert script.attempts(label) == len(ages) >= 2
    reason = status.step("s").park_reason or ""
    assert "may forget the idempotency key" in reason or "send window of the step's key" in reason


@pytest.mark.parametrize(
    ("decision", "resource_id", "final_state", "step_state", "attempts"),
    [
        (
            ReconcileDecision.HAPPENED,
            "ch_found_by_hand",
            TaskState.SUCCEEDED,
            StepState.SUCCEEDED,
            1,
        ),
        (ReconcileDecision.DID_NOT_HAPPEN, None, TaskState.SUCCEEDED, StepState.SUCCEEDED, 2),
        (ReconcileDecision.ABANDON, None, TaskState.FAILED, StepState.ABANDONED, 1),
    ],
)
async def test_a_parked_step_resumes_on_each_reconcile_decision(
    time_skipping_env: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    worker: Worker,
    decision: ReconcileDecision,
    resource_id: str | None,
    final_state: TaskState,
    step_state: StepState,
    attempts: int,
) -> None:
    label = script.plan(f"reconcile-{decision.value}", U, S)
    handle = await start(
        time_skipping_env,
        task_queue,
        ("pay", "scripted_unsafe", {"label": label}),
        ("after", "scripted_safe", {"label": f"after-{decision.value}"}),
    )
    await wait_until(time_skipping_env, handle, parked)
    answer = await handle.execute_update(
        AgentTaskWorkflow.reconcile,
        ReconcileInput(
            step_id="pay",
            decision=decision,
            resource_id=resource_id,
            operator="ops@acme",
            reason="checked the provider dashboard",
        ),
    )
    result = await handle.result()

    assert answer.step_id == "pay"
    assert result.state is final_state
    assert result.step("pay").state is step_state
    assert script.attempts(label) == attempts
    [record] = result.decisions
    assert (record.kind, record.decision, record.operator, record.accepted) == (
        "reconcile",
        decision.value,
        "ops@acme",
        True,
    )
    assert record.reason == "checked the provider dashboard"
    if decision is ReconcileDecision.HAPPENED:
        assert result.step("pay").resource_id == "ch_found_by_hand"
    if decision is ReconcileDecision.DID_NOT_HAPPEN:
        assert result.step("pay").attempts[-1].operator_authorised
        assert result.budget.operator_authorised_attempts == 1
    if decision is ReconcileDecision.ABANDON:
        assert script.attempts(f"after-{decision.value}") == 0
        assert "abandoned by ops@acme" in (result.failure_reason or "")


async def test_invalid_reconcile_updates_are_rejected_without_touching_the_task(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("invalid-reconcile", U)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_unsafe", {"label": label}))
    before = await wait_until(time_skipping_env, handle, parked)

    wrong_step = ReconcileInput(
        step_id="nope", decision=ReconcileDecision.ABANDON, operator="ops", reason="x"
    )
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(AgentTaskWorkflow.reconcile, wrong_step)
    assert "no step 'nope'" in str(refused.value.cause)

    # A payload that skips the model's own validation still meets the workflow's.
    no_resource = ReconcileInput.model_construct(
        step_id="s",
        decision=ReconcileDecision.HAPPENED,
        operator="ops",
        reason="x",
        resource_id=None,
    )
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(AgentTaskWorkflow.reconcile, no_resource)

    after = await handle.query(AgentTaskWorkflow.status)
    assert after == before
    assert await accepted_updates(handle) == 0
    assert script.attempts(label) == 1


async def test_a_running_step_cannot_be_reconciled(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    handle = await start(
        time_skipping_env,
        task_queue,
        ("a", "scripted_approval", {"label": "gate", "amount": 500}),
    )
    await wait_until(
        time_skipping_env, handle, lambda status: status.state is TaskState.AWAITING_APPROVAL
    )
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            AgentTaskWorkflow.reconcile,
            ReconcileInput(
                step_id="a", decision=ReconcileDecision.ABANDON, operator="o", reason="r"
            ),
        )
    assert "not parked" in str(refused.value.cause)
    await handle.terminate("test over")


async def test_approval_gates_the_first_attempt_and_binds_to_the_arguments(
    own_time_skipping_env: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    own_worker: Worker,
) -> None:
    arguments = {"label": "big-refund", "amount": 500}
    handle = await start(own_time_skipping_env, task_queue, ("r", "scripted_approval", arguments))
    status = await wait_until(
        own_time_skipping_env, handle, lambda s: s.state is TaskState.AWAITING_APPROVAL
    )
    await own_time_skipping_env.sleep(timedelta(hours=5))  # scenario: every timer due fires
    assert script.attempts("big-refund") == 0
    assert status.step("r").arguments_digest == arguments_digest("scripted_approval", arguments)

    other_arguments = arguments_digest("scripted_approval", {"label": "big-refund", "amount": 5})
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(
            AgentTaskWorkflow.approve,
            ApproveInput(
                step_id="r",
                approved=True,
                approver="cfo",
                reason="fine",
                arguments_digest=other_arguments,
            ),
        )
    assert "other arguments" in str(refused.value.cause)
    assert script.attempts("big-refund") == 0

    await handle.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="r",
            approved=True,
            approver="cfo",
            reason="customer is right",
            arguments_digest=status.step("r").arguments_digest,
        ),
    )
    result = await handle.result()
    assert result.state is TaskState.SUCCEEDED
    assert script.attempts("big-refund") == 1
    [record] = result.decisions
    assert (record.kind, record.decision, record.operator) == ("approve", "approve", "cfo")
    assert record.arguments_digest == status.step("r").arguments_digest


async def test_a_denied_step_never_runs(
    own_time_skipping_env: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    own_worker: Worker,
) -> None:
    arguments = {"label": "denied-refund", "amount": 101}
    handle = await start(own_time_skipping_env, task_queue, ("r", "scripted_approval", arguments))
    status = await wait_until(
        own_time_skipping_env, handle, lambda s: s.state is TaskState.AWAITING_APPROVAL
    )
    await handle.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="r",
            approved=False,
            approver="cfo",
            reason="looks like fraud",
            arguments_digest=status.step("r").arguments_digest,
        ),
    )
    result = await handle.result()
    await own_time_skipping_env.sleep(timedelta(hours=2))  # scenario: every timer due fires

    assert script.attempts("denied-refund") == 0
    assert result.state is TaskState.FAILED
    assert result.step("r").state is StepState.DENIED
    assert "denied by cfo" in (result.failure_reason or "")


async def test_below_the_threshold_no_approval_is_needed(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    handle = await start(
        time_skipping_env, task_queue, ("r", "scripted_approval", {"label": "small", "amount": 100})
    )
    result = await handle.result()
    assert result.state is TaskState.SUCCEEDED
    assert result.decisions == []


async def test_signals_decide_like_updates_and_invalid_ones_are_only_recorded(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("by-signal", U, S)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_unsafe", {"label": label}))
    await wait_until(time_skipping_env, handle, parked)

    await handle.signal(
        AgentTaskWorkflow.reconcile_signal,
        ReconcileInput(
            step_id="zzz", decision=ReconcileDecision.ABANDON, operator="ui", reason="oops"
        ),
    )
    status = await wait_until(time_skipping_env, handle, lambda s: len(s.decisions) == 1)
    assert status.state is TaskState.PARKED
    assert status.decisions[0].accepted is False
    assert "no step 'zzz'" in (status.decisions[0].rejection or "")

    await handle.signal(
        AgentTaskWorkflow.reconcile_signal,
        ReconcileInput(
            step_id="s", decision=ReconcileDecision.DID_NOT_HAPPEN, operator="ui", reason="checked"
        ),
    )
    result = await handle.result()
    assert result.state is TaskState.SUCCEEDED
    assert script.attempts(label) == 2
    assert [(d.via, d.accepted) for d in result.decisions] == [("signal", False), ("signal", True)]


async def test_budget_exhausted_after_an_unknown_parks_instead_of_failing(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("unknown-then-transient", U, T)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_safe", {"label": label}))
    status = await wait_until(time_skipping_env, handle, parked)

    assert script.attempts(label) == FAST_BUDGET.max_attempts_per_step
    assert "exhausted after an unknown" in (status.step("s").park_reason or "")
    await handle.terminate("test over")


async def test_invalid_arguments_fail_the_task_by_the_attempts_rejection_and_nothing_runs(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    # A task started by hand (no boundary validated it): the workflow never asks this
    # worker's input model; the attempt does, and its rejection is in history.
    handle = await start(
        time_skipping_env,
        task_queue,
        ("s", "scripted_safe", {"label": "x", "surprise": 1}),
    )
    result = await handle.result()
    assert result.state is TaskState.FAILED
    assert "invalid arguments" in (result.failure_reason or "")
    assert [attempt.outcome for attempt in result.step("s").attempts] == [OutcomeClass.REJECTED]
    assert script.attempts("x") == 0 and len(script.rejected) == 1


async def test_a_tool_this_worker_lacks_waits_for_one_that_has_it(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    # A task started by hand without its tools' policies (here: a tool nobody catalogued)
    # is refused at its first workflow task, saying what to do; nothing ran.
    unknown = await start(time_skipping_env, task_queue, ("s", "no_such_tool", {}))
    with pytest.raises(WorkflowFailureError) as refused:
        await unknown.result()
    assert isinstance(refused.value.cause, ApplicationError)
    assert refused.value.cause.type == "StartedWithoutPolicies"
    assert "AgentTaskInput.policies" in str(refused.value.cause)
    # TaskClient says so before it sends anything: no task of that id exists.
    tasks = TaskClient(time_skipping_env.client, task_queue=task_queue)
    plan = AgentTaskInput(
        tenant="acme",
        principal="agent-1",
        steps=[StepInput(step_id="s", tool="no_such_tool", arguments={})],
    )
    with pytest.raises(UnknownTool, match="no_such_tool"):
        await tasks.start(plan, workflow_id="never-started")
    with pytest.raises(UnknownTool, match="no_such_tool"):
        await tasks.call("never-started", CallInput(call_id="c", tool="no_such_tool", arguments={}))
    with pytest.raises(RPCError) as missing:
        await time_skipping_env.client.get_workflow_handle("never-started").describe()
    assert missing.value.status is RPCStatusCode.NOT_FOUND

    # A tool whose activity no worker registered: the attempts ran nothing (transient),
    # and the step fails with the fix once the budget is spent, never parks.
    if "scripted_unregistered" not in CATALOGUE:
        CATALOGUE.register(replace(SAFE, name="scripted_unregistered"))
    handle = await start(
        time_skipping_env, task_queue, ("s", "scripted_unregistered", {"label": "x"})
    )
    result = await handle.result()
    [step] = result.steps
    assert step.state is StepState.FAILED
    assert [attempt.outcome for attempt in step.attempts] == [T, T, T]
    assert "has no tool 'scripted_unregistered', so nothing ran" in (step.failure_reason or "")


async def test_backoff_timers_follow_the_budget(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("backoff", T, T, S)
    handle = await start(time_skipping_env, task_queue, ("s", "scripted_safe", {"label": label}))
    await handle.result()
    history = await handle.fetch_history()
    timers = [
        event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED
    ]
    assert len(timers) == 2
    assert timers[0] <= FAST_BUDGET.backoff_cap(1)
    assert timers[1] <= FAST_BUDGET.backoff_cap(2)


# ── pinned policy, send-by deadline, machine-time deadline, stored failures ──────────


@pytest.mark.parametrize("unusable", list(KeyUnusable))
async def test_a_key_no_attempt_may_send_under_is_looked_up_then_parked_without_retrying(
    time_skipping_env: WorkflowEnvironment,
    task_queue: str,
    script: Script,
    worker: Worker,
    unusable: KeyUnusable,
) -> None:
    label = script.plan(f"unusable-{unusable.value}", U, unusable, S)
    found = script.plan(f"found-{unusable.value}", unusable)
    script.found.add(found)
    handle = await start(
        time_skipping_env, task_queue, ("s", "scripted_provider", {"label": label})
    )
    status = await wait_until(time_skipping_env, handle, parked)
    assert script.attempts(label) == 2  # never a third: the budget is not what stops it
    assert script.lookups[label] == 1
    assert f"the key is unusable ({unusable.value})" in (status.step("s").park_reason or "")
    await handle.terminate("test over")

    other = await start(time_skipping_env, task_queue, ("s", "scripted_provider", {"label": found}))
    result = await other.result()
    assert result.state is TaskState.SUCCEEDED
    assert result.step("s").resource_id == f"res-{found}-found"
    assert script.attempts(found) == 1


async def test_time_awaiting_approval_does_not_count_against_the_deadline(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    label = script.plan("late-approval", T, S)
    brief = FAST_BUDGET.model_copy(
        update={"deadline": timedelta(seconds=2), "initial_backoff": timedelta(milliseconds=100)}
    )
    handle = await start(
        time_skipping_env,
        task_queue,
        ("r", "scripted_approval", {"label": label, "amount": 500}),
        budget=brief,
    )
    status = await eventually(
        lambda: handle.query(AgentTaskWorkflow.status),
        until=lambda s: s.state is TaskState.AWAITING_APPROVAL,
        what="the step awaits approval",
    )
    # The approver answers after the task's whole deadline has gone by.
    await eventually(
        time_skipping_env.get_current_time,
        until=lambda now: now > status.budget.deadline_at + timedelta(milliseconds=500),
        what="the task's deadline passed while it awaited approval",
    )
    await handle.execute_update(
        AgentTaskWorkflow.approve,
        ApproveInput(
            step_id="r",
            approved=True,
            approver="cfo",
            reason="fine",
            arguments_digest=status.step("r").arguments_digest,
        ),
    )
    result = await handle.result()
    assert result.state is TaskState.SUCCEEDED
    assert [attempt.outcome for attempt in result.step("r").attempts] == [T, S]
    assert result.budget.waited_for_people >= brief.deadline
    # The deadline moved by the time spent waiting: it is still ahead of the attempts.
    assert result.budget.deadline_at > result.step("r").attempts[-1].finished_at


async def test_a_task_decides_by_the_policy_pinned_when_it_started(
    dev_server: WorkflowEnvironment,
    task_queue: str,
    script: Script,
) -> None:
    # The dev server: a stopped worker's sticky queue is reset, so the next worker
    # replays the whole history at once (the time-skipping server waits it out).
    async def status_of(handle: Handle) -> TaskStatus:
        return await handle.query(AgentTaskWorkflow.status)

    arguments = {"label": "pinned-threshold", "amount": 500}
    async with scripted_worker(dev_server, task_queue, script):
        handle = await start(dev_server, task_queue, ("r", "scripted_approval", arguments))
        await eventually(
            lambda: status_of(handle),
            until=lambda s: s.state is TaskState.AWAITING_APPROVAL,
            what="the step awaits approval",
        )
    # The next worker runs with another threshold: 500 no longer needs approval there.
    raised = replace(
        NEEDS_APPROVAL,
        approval_threshold=ApprovalThreshold(argument="amount", above=Decimal(1000)),
        version="2",
    )
    next_release = Catalogue(
        tuple(
            raised if contract.name == raised.name else contract for contract in SCRIPTED_CONTRACTS
        )
    )
    async with scripted_worker(dev_server, task_queue, script, next_release):
        # A fresh worker replays the whole history: it still waits for the approval.
        status = await status_of(handle)
        assert status.state is TaskState.AWAITING_APPROVAL
        assert script.attempts("pinned-threshold") == 0
        pinned = status.policies["scripted_approval"]
        assert (pinned.approval_above, pinned.contract_version) == (Decimal(100), "1")
        await handle.execute_update(
            AgentTaskWorkflow.approve,
            ApproveInput(
                step_id="r",
                approved=True,
                approver="cfo",
                reason="fine",
                arguments_digest=status.step("r").arguments_digest,
            ),
        )
        result = await handle.result()
        # A task admitted now carries the new values and needs no approval.
        fresh = await start(
            dev_server,
            task_queue,
            ("r", "scripted_approval", {"label": "new-threshold", "amount": 500}),
            catalogue=next_release,
        )
        fresh_result = await fresh.result()

    assert result.state is TaskState.SUCCEEDED
    assert script.attempts("pinned-threshold") == 1
    failed_tasks = [
        event
        for event in (await handle.fetch_history()).events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]
    assert failed_tasks == []  # no non-determinism on the other worker
    assert fresh_result.state is TaskState.SUCCEEDED and fresh_result.decisions == []
    assert fresh_result.policies["scripted_approval"].approval_above == Decimal(1000)


async def test_did_not_happen_needs_a_look_up_miss_that_proves_the_effect_absent(
    time_skipping_env: WorkflowEnvironment, task_queue: str, script: Script, worker: Worker
) -> None:
    # The look-up reads an index that lags: its miss proves nothing at first.
    label = script.plan("lagging", KeyUnusable.STORED_FAILURE, S)
    script.lagging[label] = timedelta(seconds=4)
    handle = await start(
        time_skipping_env, task_queue, ("s", "scripted_provider", {"label": label})
    )
    await wait_until(time_skipping_env, handle, parked)
    did_not_happen = ReconcileInput(
        step_id="s", decision=ReconcileDecision.DID_NOT_HAPPEN, operator="ops", reason="checked"
    )
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(AgentTaskWorkflow.reconcile, did_not_happen)
    message = str(refused.value.cause)
    assert "could not show that step s's effect does not exist" in message
    assert "--unverified, or decide again after" in message
    assert script.attempts(label) == 1  # nothing was sent

    # Past the lag, the same miss proves it: accepted, checked.
    for _ in range(3):  # 2 s at a time, as wait_until skips: the lag has passed
        await time_skipping_env.sleep(timedelta(seconds=2))
    await handle.execute_update(AgentTaskWorkflow.reconcile, did_not_happen)
    result = await handle.result()
    assert result.state is TaskState.SUCCEEDED and script.attempts(label) == 2
    assert [d.verified for d in result.decisions if d.accepted] == [True]

    # Before the lag, the operator may take it on their word: recorded unverified.
    other = script.plan("lagging-by-hand", KeyUnusable.STORED_FAILURE, S)
    script.lagging[other] = timedelta(seconds=4)
    handle = await start(
        time_skipping_env, task_queue, ("s", "scripted_provider", {"label": other})
    )
    await wait_until(time_skipping_env, handle, parked)
    await handle.execute_update(
        AgentTaskWorkflow.reconcile, did_not_happen.model_copy(update={"unverified": True})
    )
    result = await handle.result()
    assert result.state is TaskState.SUCCEEDED
    assert [d.verified for d in result.decisions if d.accepted] == [False]
