"""``PruneIdempotencyRecordsWorkflow``: one pass of deleting expired terminal records.

A Temporal Schedule runs it every ``ONCEFLOW_GATEWAY_PRUNE_INTERVAL_SECONDS``; a failed
pass is not retried (one retry owner: the schedule's next run is the retry).
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from onceflow.encryption import ClearText
    from onceflow.workflows.pruning_models import PRUNE_IDEMPOTENCY_RECORDS, PruneInput, PruneResult


@workflow.defn
class PruneIdempotencyRecordsWorkflow:
    """Deletes terminal idempotency records whose result retention has passed."""

    @workflow.run
    async def run(self, request: PruneInput) -> PruneResult:
        result: PruneResult = await workflow.execute_activity(
            PRUNE_IDEMPOTENCY_RECORDS,
            request,
            result_type=PruneResult,
            start_to_close_timeout=timedelta(minutes=10),
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=ClearText("delete expired terminal idempotency records"),
        )
        return result
