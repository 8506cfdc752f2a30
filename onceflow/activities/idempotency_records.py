"""The boundary's records, written from inside Temporal: task outcomes and pruning.

``record_task_outcome`` is how a task answers repeated requests even after the gateway
that started it died: the workflow itself stores its terminal result in the record.
"""

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from temporalio import activity

from onceflow.gateway import IdempotencyStore, stored_outcome
from onceflow.workflows.pruning_models import PRUNE_IDEMPOTENCY_RECORDS, PruneInput, PruneResult
from onceflow.workflows.task_models import RECORD_TASK_OUTCOME, TaskOutcomeInput


class TaskOutcomeResult(BaseModel):
    """Whether the outcome reached a record."""

    recorded: bool
    """False when no processing record names this task run (already recorded, or the
    task was not started by the boundary): nothing was changed."""


class IdempotencyRecordActivities:
    """Activities on ``idempotency_records``, bound to the worker's connection pool."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._records = IdempotencyStore(pool)

    @activity.defn(name=RECORD_TASK_OUTCOME)
    async def record_task_outcome(self, outcome: TaskOutcomeInput) -> TaskOutcomeResult:
        """Store the task's terminal status and body in the record that started it.

        Fenced: only a processing record with this workflow id, not bound to another run,
        is written, so a different claim is never overwritten. Repeating it is harmless.
        """
        state, status_code, body, resource_id = stored_outcome(outcome.status)
        recorded = await self._records.record_outcome(
            workflow_id=outcome.workflow_id,
            run_id=activity.info().workflow_run_id,
            state=state,
            status_code=status_code,
            response_body=body,
            resource_id=resource_id,
        )
        activity.logger.info(
            "task %s outcome %s %s",
            outcome.workflow_id,
            state.value,
            "recorded" if recorded else "had no processing record",
        )
        return TaskOutcomeResult(recorded=recorded)

    @activity.defn(name=PRUNE_IDEMPOTENCY_RECORDS)
    async def prune_idempotency_records(self, request: PruneInput) -> PruneResult:
        """Delete terminal records past ``result_expires_at``; processing ones never."""
        pruned = await self._records.prune(batch=request.batch)
        activity.logger.info("pruned %d idempotency records", pruned.records)
        return PruneResult(records=pruned.records, usage_windows=pruned.usage_windows)
