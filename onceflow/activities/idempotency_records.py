"""The boundary's idempotency records, written from inside Temporal: two of a task
outcome's four writers (the rules: ``onceflow.idempotency``), the workflow's own write
(``record_task_outcome``) and the upkeep pass (``prune_idempotency_records``, run by the
prune schedule), which then deletes expired terminal records.
"""

from datetime import timedelta

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel
from temporalio import activity

from onceflow.idempotency import REQUEST_HASH_MEMO, IdempotencyStore, Unrecorded, stored_outcome
from onceflow.task_api import TaskClient
from onceflow.tools.worker import prune_intents
from onceflow.workflows.pruning_models import PRUNE_IDEMPOTENCY_RECORDS, PruneInput, PruneResult
from onceflow.workflows.task_models import RECORD_TASK_OUTCOME, TaskOutcomeInput

VISIBILITY_PAGE = 100
"""Tasks asked about in one visibility query."""


class TaskOutcomeResult(BaseModel):
    """Whether the outcome reached a record."""

    recorded: bool
    """False when no processing record names this task run (already recorded, or the
    task was not started by the boundary): nothing was changed."""


class IdempotencyRecordActivities:
    """Activities on ``idempotency_records``, bound to the worker's connection pool."""

    def __init__(self, pool: AsyncConnectionPool, tasks: TaskClient) -> None:
        self._records = IdempotencyStore(pool)
        self._tasks = tasks

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
        """Write the outcome of ended tasks whose starter did not, then delete terminal
        records past ``result_expires_at``; processing ones are never deleted."""
        settled = await self._settle_started(timedelta(seconds=request.settle_after_seconds))
        pruned = await self._records.prune(batch=request.batch)
        intents = await prune_intents(self._records.pool, batch=request.batch)
        activity.logger.info(
            "settled %d and pruned %d idempotency records and %d intents",
            settled,
            pruned.records,
            intents,
        )
        return PruneResult(
            records=pruned.records,
            usage_windows=pruned.usage_windows,
            settled=settled,
            intents=intents,
        )

    async def _settle_started(self, older_than: timedelta) -> int:
        settled = 0
        waiting = {
            record.workflow_id: record
            for record in await self._records.started_unrecorded(older_than=older_than)
        }
        ids = list(waiting)
        for start in range(0, len(ids), VISIBILITY_PAGE):
            for workflow_id in await self._tasks.closed_among(ids[start : start + VISIBILITY_PAGE]):
                record = waiting[workflow_id]
                # A claim its owner never marked: its key's task may be an older one, left
                # from a pruned record of another request; only its own request's task
                # (the fingerprint the starter put in the memo) answers it.
                if not record.marked and not await self._started_for(record):
                    continue
                state, status_code, body, resource_id = stored_outcome(
                    await self._tasks.ended(workflow_id)
                )
                settled += await self._records.record_outcome(
                    workflow_id=workflow_id,
                    run_id=None,
                    state=state,
                    status_code=status_code,
                    response_body=body,
                    resource_id=resource_id,
                    request_hash=None if record.marked else record.request_hash,
                )
        return settled

    async def _started_for(self, record: Unrecorded) -> bool:
        memo = await self._tasks.memo(record.workflow_id)
        return memo is not None and memo.get(REQUEST_HASH_MEMO) == record.request_hash
