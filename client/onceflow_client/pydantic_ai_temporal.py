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

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from pydantic_ai import ModelRetry, RunContext, UserError
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.tools import AgentDepsT, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset, ToolsetTool
from pydantic_core import SchemaValidator, core_schema
from temporalio import workflow
from temporalio.exceptions import NexusOperationError

from onceflow_client._pydantic_ai_told import ALREADY_DONE

__all__ = ["ALREADY_DONE", "DEFAULT_ENDPOINT", "OnceflowNexusToolset"]

DEFAULT_ENDPOINT = "onceflow-tools"
"""The endpoint ``onceflow dev`` creates."""
SERVICE = "OnceflowTools"
OPERATION = "call_tool"
STEP_ID = "1"
"""A call runs as a one-step task: its step."""
METADATA_KEY = "onceflow"

_CALL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_ANY_ARGUMENTS = SchemaValidator(core_schema.any_schema())
"""onceflow validates the arguments against the tool's input model and refuses a bad call
before anything starts; a local copy of that check could only disagree."""
_NO_EFFECT_OUTCOMES = frozenset({"rejected", "transient"})


class OnceflowNexusToolset(AbstractToolset[AgentDepsT]):
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
        self._id = id
        self._timeout = schedule_to_close_timeout
        self._max_retries = max_retries
        self._definitions = {
            str(tool["name"]): ToolDefinition(
                name=str(tool["name"]),
                description=str(tool.get("description") or ""),
                parameters_json_schema=dict(tool.get("input_schema") or {"type": "object"}),
                metadata={METADATA_KEY: dict(tool.get("annotations") or {})},
            )
            for tool in catalogue
        }

    @property
    def id(self) -> str | None:
        return self._id

    async def get_tools(self, ctx: RunContext[AgentDepsT]) -> dict[str, ToolsetTool[AgentDepsT]]:
        return {
            name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self._max_retries,
                args_validator=_ANY_ARGUMENTS,
            )
            for name, definition in self._definitions.items()
        }

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
                {"call_id": call_id(ctx.tool_call_id), "tool": name, "arguments": tool_args},
                output_type=dict,
                schedule_to_close_timeout=self._timeout,
            )
        except NexusOperationError as error:
            raise _refusal(error) from None
        told = told_about(_step(status))
        if isinstance(told, ModelRetry | ToolFailed):
            raise told
        return told


def call_id(tool_call_id: str) -> str:
    """The operation's ``call_id`` for a model's tool-call id: itself when it fits
    onceflow's pattern, else a digest of it."""
    if _CALL_ID.fullmatch(tool_call_id):
        return tool_call_id
    return "c." + hashlib.sha256(tool_call_id.encode()).hexdigest()[:48]


def told_about(step: Mapping[str, Any]) -> Any:
    """What the model is told about a step that ended: its result, or a ``ModelRetry`` /
    ``ToolFailed`` (returned, for the caller to raise)."""
    state = str(step.get("state"))
    result = dict(step.get("result") or {})
    if state == "succeeded":
        if not result and step.get("resource_id"):
            result = {"resource_id": step["resource_id"]}
        if "repeat_of" in result:
            return ALREADY_DONE + json.dumps(result, sort_keys=True, default=str)
        return result
    reason = step.get("failure_reason") or state
    if state == "denied":
        return ToolFailed(f"denied by a person: {reason}. Do not call it again for this.")
    if state == "abandoned":
        return ToolFailed(
            f"abandoned by an operator: {reason}. Whether it took effect is for a person "
            "to settle; do not call it again."
        )
    outcomes = [str(attempt.get("outcome")) for attempt in step.get("attempts") or []]
    if outcomes and outcomes[-1] == "rejected" and set(outcomes) <= _NO_EFFECT_OUTCOMES:
        return ModelRetry(f"rejected, nothing was done: {reason}")
    return ToolFailed(
        f"failed: {reason}. onceflow has retried it as far as its budget allows; calling "
        "it again will not help."
    )


def _step(status: Mapping[str, Any]) -> Mapping[str, Any]:
    steps = status.get("steps") or []
    step = next((step for step in steps if step.get("step_id") == STEP_ID), None)
    if step is None:
        raise ToolFailed(f"onceflow's task answered without its step: {status.get('state')}")
    return dict(step)


def _refusal(error: NexusOperationError) -> ModelRetry | ToolFailed:
    """onceflow refused the call before anything started: the model may fix invalid
    arguments; anything else (a tool not allowed, a call id reused) it cannot."""
    cause = error.cause
    message = str(getattr(cause, "message", None) or cause or error)
    if "invalid request" in message or "arguments cannot be taken" in message:
        return ModelRetry(f"invalid arguments, nothing was done: {message}")
    return ToolFailed(f"refused, nothing was done: {message}")
