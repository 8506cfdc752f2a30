"""``PlanSteps``: a plan's life, its steps run in order, then its end published and
recorded."""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from onceflow.workflows.patches import POLICIES_CARRIED
    from onceflow.workflows.task_models import AgentTaskInput, TaskState, TaskStatus
    from onceflow.workflows.visibility import TASK_STATE, TASK_TENANT, TASK_TOOLS
from onceflow.workflows._retired_policy_pin import (
    pin_policies_as_before_0_3_0,
    started_without_policies,
)
from onceflow.workflows._step_runner import StepRunner
from onceflow.workflows._task_book import StepStopped, TaskBook


class PlanSteps:
    """Runs a plan: every step given at its start, in order, until one stops it."""

    # One per cached task: slots, no attribute dict to hold.
    __slots__ = ("_book", "_memory", "_run", "_steps")

    def __init__(self, book: TaskBook, steps: StepRunner) -> None:
        self._book = book
        self._memory = book.memory
        self._run = book.run
        self._steps = steps

    async def run(self, task: AgentTaskInput) -> TaskStatus:
        """Run the plan's steps to the task's end, and answer its status."""
        if task.policies is None and workflow.patched(POLICIES_CARRIED):
            # Started by hand without what every admitted plan carries: refused before it
            # does anything (a task of an earlier release replays the pin below).
            raise started_without_policies()
        if not task.started_with_attributes:
            workflow.upsert_search_attributes(
                [
                    TASK_TENANT.value_set(task.tenant),
                    TASK_TOOLS.value_set(task.plan_tools()),
                    TASK_STATE.value_set(self._run.state.value),
                ]
            )
        self._book.take_release_of_start()
        if task.policies is not None:
            self._memory.policies = dict(task.policies)
        else:
            # Retired (POLICIES_CARRIED): only a plan started without policies before
            # 0.3.0 gets here. Its first step counts from the time before the local
            # activity (see TaskRun.clock_before_pin).
            if task.steps:
                self._run.clock_before_pin[task.steps[0].step_id] = workflow.now()
            self._memory.policies = await pin_policies_as_before_0_3_0(
                sorted({s.tool for s in task.steps})
            )
        failure = None
        try:
            for step in task.steps:
                await self._steps.run_step(step)
        except StepStopped as stopped:
            failure = str(stopped)
        records = self._book.writes_its_outcome()
        if records:
            await self._book.end_durably()
        self._run.failure_reason = failure
        self._book.end_as(TaskState.SUCCEEDED if failure is None else TaskState.FAILED)
        if records:
            await self._book.record_outcome()
        # A decision arriving as the task ends must finish before the workflow completes.
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._book.status()
