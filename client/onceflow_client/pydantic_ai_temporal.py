"""onceflow's tools for a PydanticAI agent that runs durably in a Temporal workflow
(PydanticAI's ``TemporalDurability``): each tool call is an operation of onceflow's Nexus
service, made from the workflow itself. Needs the extra:
``pip install 'onceflow-client[pydantic-ai-temporal]'``::

    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import TemporalDurability
    from onceflow_client.pydantic_ai_temporal import OnceflowNexusToolset

    # The catalogue, read once outside any workflow (``await client.list_tools()``) and
    # kept with the agent's code, or the tool descriptions written out.
    tools = OnceflowNexusToolset(CATALOGUE, endpoint="onceflow-tools")
    agent = Agent(model, name="payments", toolsets=[tools], capabilities=[TemporalDurability()])

PydanticAI leaves this toolset unwrapped (it is no function toolset): its calls are no
activities, so there is no second retry owner and no activity waits while a person
decides. Each call is identified by the caller's workflow and the model's tool-call id
(recorded in the model's activity result, so the same on every replay): the caller's
replays and retries reach the same onceflow task, never a second one. The call returns
when the task ends; a call that parks or awaits approval keeps the workflow waiting
durably until an operator decides (``onceflow reconcile``, ``onceflow approve``), so the
model is never told "error, try again" about an effect that may exist.

What the model is told about each call::

    succeeded                         the tool's result
    another call of the intent        "already done: <result>" (nothing ran again)
      answered it
    refused (invalid arguments),      ModelRetry: nothing happened, fix the arguments
      rejected with no effect
    denied                            ToolFailed: the person's reason, not to retry
    failed, abandoned, not allowed    ToolFailed: told plainly, not invited to retry
"""

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from pydantic_ai import ModelRetry, RunContext, UserError
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import ToolsetTool
from temporalio import workflow
from temporalio.exceptions import NexusOperationError

from onceflow_client._nexus_told import (
    ALREADY_DONE,
    DEFAULT_ENDPOINT,
    OPERATION,
    SERVICE,
    Telling,
    Told,
    operation_input,
    told_about_refusal,
    told_about_status,
    told_about_step,
)
from onceflow_client._pydantic_ai_catalogue import CatalogueToolset

__all__ = ["ALREADY_DONE", "DEFAULT_ENDPOINT", "OnceflowNexusToolset"]


class OnceflowNexusToolset(CatalogueToolset[AgentDepsT]):
    """onceflow's tools (the catalogue given) as one PydanticAI toolset whose calls are
    Nexus operations; usable only in a Temporal workflow."""

    def __init__(
        self,
        catalogue: Sequence[Mapping[str, Any]],
        *,
        endpoint: str = DEFAULT_ENDPOINT,
        id: str | None = "onceflow",
        schedule_to_close_timeout: timedelta = timedelta(days=7),
        max_retries: int = 2,
    ) -> None:
        """
        Args:
            catalogue: Tool descriptions as ``OnceflowClient.list_tools`` returns them
                (``name``, ``description``, ``input_schema``).
            endpoint: The Nexus endpoint routing to onceflow. Default ``onceflow-tools``.
            id: The toolset's id among the agent's toolsets. Default ``onceflow``.
            schedule_to_close_timeout: How long one call may take, a person's decision
                on a parked or approval-awaiting call included. Default 7 days.
            max_retries: How many times the model may correct one tool's arguments after
                a refusal (``ModelRetry``). Default 2.
        """
        self._endpoint = endpoint
        super().__init__(catalogue, id=id, max_retries=max_retries)
        self._timeout = schedule_to_close_timeout

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """Call the tool as a Nexus operation and wait for its task to end; see the
        module for what the model is told."""
        if not workflow.in_workflow():
            raise UserError(
                "OnceflowNexusToolset calls tools from a Temporal workflow (an agent with "
                "TemporalDurability, run in one); elsewhere use onceflow_client.pydantic_ai"
            )
        if ctx.tool_call_id is None:
            raise ValueError("onceflow tools are called with the model's tool-call id")
        tools = workflow.create_nexus_client(service=SERVICE, endpoint=self._endpoint)
        try:
            status = await tools.execute_operation(
                OPERATION,
                operation_input(ctx.tool_call_id, name, tool_args),
                output_type=dict,
                schedule_to_close_timeout=self._timeout,
            )
        except NexusOperationError as error:
            raise _raised(told_about_refusal(error)) from None
        told = told_about_status(status)
        if told.telling is not Telling.RESULT:
            raise _raised(told)
        return told.content


def told_about(step: Mapping[str, Any]) -> Any:
    """What the model is told about a step that ended: its result, or a ``ModelRetry`` /
    ``ToolFailed`` (returned, for the caller to raise)."""
    told = told_about_step(step)
    return told.content if told.telling is Telling.RESULT else _raised(told)


def _raised(told: Told) -> ModelRetry | ToolFailed:
    """PydanticAI's own exception for a call the model is told not to take as a result."""
    if told.telling is Telling.RETRY:
        return ModelRetry(told.content)
    return ToolFailed(told.content)
