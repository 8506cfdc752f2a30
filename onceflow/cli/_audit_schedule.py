"""The Temporal Schedule behind ``onceflow audit --schedule``: an ``AuditWorkflow`` of one
tool family every interval, on the deployment's task queue (its workers hold the auditor).

Creating it again with other settings updates it: one audit schedule per family and task
queue, whatever the number of times an operator runs the command.
"""

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from onceflow.encryption import ClearText
from onceflow.tools.worker import AuditRunInput
from onceflow.workflows.audit import AuditWorkflow


def audit_schedule_id(family: str, task_queue: str) -> str:
    """One audit schedule per family and task queue (that is, per deployment)."""
    return f"onceflow-audit-{family}-{task_queue}"


async def ensure_audit_schedule(
    client: Client, *, task_queue: str, every: timedelta, request: AuditRunInput
) -> tuple[str, bool]:
    """Create the family's audit schedule, or update it to these settings.

    Returns:
        The schedule id, and whether it was created (False: updated).
    """
    schedule_id = audit_schedule_id(request.family, task_queue)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            AuditWorkflow.run,
            request,
            id=f"{schedule_id}-run",
            task_queue=task_queue,
            static_summary=ClearText(
                f"audit {request.family} against its provider, window {request.window}"
            ),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        # A slow audit is not stacked on: the next interval audits an overlapping window.
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        await client.create_schedule(schedule_id, schedule)
        return schedule_id, True
    except ScheduleAlreadyRunningError:

        def replace(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(schedule_id).update(replace)
        return schedule_id, False
