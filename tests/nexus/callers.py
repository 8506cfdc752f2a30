"""A caller of onceflow's Nexus service: an agent's workflow in another application, on
its own task queue and worker, that calls ``charge_payment`` through the endpoint.

Written as a user would: the service contract and the models come from
``onceflow.nexus``, passed through the sandbox; nothing else of onceflow's.
"""

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import NexusOperationError

with workflow.unsafe.imports_passed_through():
    from onceflow.nexus import NexusPlan, NexusToolCall, OnceflowTools
    from onceflow.workflows.task_models import TaskStatus


class PlannedCall(BaseModel):
    call_id: str
    tool: str
    arguments: dict[str, Any]


class AgentInput(BaseModel):
    endpoint: str
    calls: list[PlannedCall]


class AgentOutcome(BaseModel):
    statuses: list[TaskStatus]
    refusals: list[str] = []


@workflow.defn
class ChargingAgent:
    """Calls each planned tool in turn through Nexus, waiting for each to end."""

    @workflow.run
    async def run(self, input: AgentInput) -> AgentOutcome:
        tools = workflow.create_nexus_client(service=OnceflowTools, endpoint=input.endpoint)
        outcome = AgentOutcome(statuses=[])
        for call in input.calls:
            try:
                status = await tools.execute_operation(
                    OnceflowTools.call_tool,
                    NexusToolCall(call_id=call.call_id, tool=call.tool, arguments=call.arguments),
                    schedule_to_close_timeout=timedelta(hours=1),
                )
            except NexusOperationError as error:
                outcome.refusals.append(str(error.cause))
                continue
            outcome.statuses.append(status)
        return outcome


@workflow.defn
class CancellingAgent:
    """Starts its one call, and cancels it when told to (the user gave up waiting)."""

    def __init__(self) -> None:
        self._give_up = False

    @workflow.signal
    def give_up(self) -> None:
        self._give_up = True

    @workflow.run
    async def run(self, input: AgentInput) -> AgentOutcome:
        tools = workflow.create_nexus_client(service=OnceflowTools, endpoint=input.endpoint)
        [call] = input.calls
        operation = await tools.start_operation(
            OnceflowTools.call_tool,
            NexusToolCall(call_id=call.call_id, tool=call.tool, arguments=call.arguments),
            schedule_to_close_timeout=timedelta(hours=1),
        )
        await workflow.wait_condition(lambda: self._give_up)
        operation.cancel()
        try:
            return AgentOutcome(statuses=[await operation])
        except NexusOperationError as error:
            return AgentOutcome(statuses=[], refusals=[str(error.cause)])


class PlanInput(BaseModel):
    endpoint: str
    plan: NexusPlan


@workflow.defn
class PlanningAgent:
    """Hands onceflow a whole plan at once, as one task."""

    @workflow.run
    async def run(self, input: PlanInput) -> TaskStatus:
        tools = workflow.create_nexus_client(service=OnceflowTools, endpoint=input.endpoint)
        return await tools.execute_operation(
            OnceflowTools.run_plan, input.plan, schedule_to_close_timeout=timedelta(hours=1)
        )
