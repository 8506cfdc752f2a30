"""The workflow ``bench.dev_server_split`` varies: a bare workflow's one no-op activity,
with payloads padded and its final state upserted as asked. In a module of its own, which
Temporal's workflow sandbox can re-import."""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from bench._bare import no_op
from onceflow.workflows.visibility import TASK_STATE


@workflow.defn
class SplitWorkflow:
    @workflow.run
    async def run(self, value: str, activity_pad: str, result_pad: str, upsert: bool) -> str:
        echoed = await workflow.execute_activity(
            no_op,
            value + activity_pad,
            start_to_close_timeout=timedelta(seconds=15),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        if upsert:
            workflow.upsert_search_attributes([TASK_STATE.value_set("succeeded")])
        return echoed[:1] + result_pad
