"""The demo's Temporal-native agent: a workflow of another application that charges a
card through onceflow's Nexus service (``OnceflowTools.call_tool``) and waits, durably,
for the call to end. Only workflow code here (the sandbox imports it again)."""

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from onceflow.nexus import NexusToolCall, OnceflowTools
    from onceflow.workflows.task_models import TaskStatus


class CheckoutInput(BaseModel):
    endpoint: str
    call_id: str
    arguments: dict[str, Any]


@workflow.defn
class CheckoutAgent:
    """Charges once through Nexus; its result is the onceflow task's final status."""

    @workflow.run
    async def run(self, input: CheckoutInput) -> TaskStatus:
        tools = workflow.create_nexus_client(service=OnceflowTools, endpoint=input.endpoint)
        return await tools.execute_operation(
            OnceflowTools.call_tool,
            NexusToolCall(call_id=input.call_id, tool="charge_payment", arguments=input.arguments),
            schedule_to_close_timeout=timedelta(days=1),
        )
