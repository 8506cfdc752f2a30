"""The parked-task gauges' scan counts the parked tasks and finds the oldest one's parked-at
time by visibility counts alone, against the dev server's own visibility store."""

import uuid
from datetime import UTC, datetime, timedelta

from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from onceflow.telemetry import OLDEST_PARKED_PRECISION, PARKED_QUERY, scan_parked_tasks
from onceflow.workflows.visibility import TASK_PARKED_AT, TASK_STATE, TASK_TENANT
from tests.harness import eventually


async def test_the_scan_counts_the_parked_tasks_and_finds_the_oldest_within_its_precision(
    dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_server.client
    tenant = f"scan-{uuid.uuid4().hex[:8]}"
    query = f"{PARKED_QUERY} AND {TASK_TENANT.name} = '{tenant}'"
    now = datetime.now(UTC)
    ages = {
        "parked-3h": timedelta(hours=3),
        "parked-2h": timedelta(hours=2),
        "recent": timedelta(0),
    }
    # Task workflows no worker runs: what visibility holds for them is what the scan reads.
    for name, age in ages.items():
        await client.start_workflow(
            "AgentTaskWorkflow",
            id=f"{tenant}-{name}",
            task_queue=task_queue,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(TASK_TENANT, tenant),
                    SearchAttributePair(TASK_STATE, "parked"),
                    SearchAttributePair(TASK_PARKED_AT, now - age),
                ]
            ),
        )
    try:

        async def all_visible() -> bool:
            return (await client.count_workflows(query)).count == len(ages)

        await eventually(all_visible, what="the three tasks are visible")
        count, oldest = await scan_parked_tasks(client, query=query)
        assert count == 3
        assert oldest is not None
        truth = now - ages["parked-3h"]
        # Never later than the truth (the age is not understated), and within the precision.
        assert oldest <= truth
        assert truth - oldest <= max(
            timedelta(seconds=1), ages["parked-3h"] * OLDEST_PARKED_PRECISION
        )
        assert await scan_parked_tasks(client, query=f"{query} AND WorkflowId = 'none'") == (
            0,
            None,
        )
    finally:
        for name in ages:
            await client.get_workflow_handle(f"{tenant}-{name}").terminate("test over")
