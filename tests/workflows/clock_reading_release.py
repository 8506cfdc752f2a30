"""A release whose workflow reads the machine's clock: production's runner (onceflow's
modules passed through the sandbox) would run it unrefused; the strict sandbox of the
tests' workers and of every replay refuses it."""

from datetime import datetime

from temporalio import workflow

from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import AgentTaskInput, TaskStatus


@workflow.defn(name="AgentTaskWorkflow")
class ClockReadingRelease(AgentTaskWorkflow):
    @workflow.run
    async def run(self, task: AgentTaskInput) -> TaskStatus:
        if datetime.now().hour >= 0:  # always true: what matters is the read
            workflow.set_current_details("")
        return await super().run(task)
