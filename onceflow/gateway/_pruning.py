"""The Temporal Schedule that prunes expired terminal idempotency records.

Once a record is pruned its key is forgotten: a retry with that key is claimed as a new
operation (``gateway/README.md``, "Retention and pruning", says what that means per tool).
"""

import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleHandle,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
)

from onceflow.encryption import ClearText
from onceflow.workflows.pruning import PruneIdempotencyRecordsWorkflow
from onceflow.workflows.pruning_models import PruneInput

log = logging.getLogger("onceflow.gateway")


def prune_schedule_id(task_queue: str) -> str:
    """One prune schedule per task queue (that is, per onceflow deployment)."""
    return f"onceflow-prune-idempotency-records-{task_queue}"


async def ensure_prune_schedule(
    client: Client, *, task_queue: str, every: timedelta
) -> ScheduleHandle:
    """Create the prune schedule unless it exists; every gateway start calls this."""
    schedule_id = prune_schedule_id(task_queue)
    schedule = Schedule(
        action=ScheduleActionStartWorkflow(
            PruneIdempotencyRecordsWorkflow.run,
            PruneInput(),
            id=f"{schedule_id}-run",
            task_queue=task_queue,
            static_summary=ClearText("prune expired idempotency records"),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )
    try:
        handle = await client.create_schedule(schedule_id, schedule)
        log.info("created schedule %s (every %s)", schedule_id, every)
        return handle
    except ScheduleAlreadyRunningError:
        return client.get_schedule_handle(schedule_id)
