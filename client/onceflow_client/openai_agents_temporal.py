"""onceflow's tools for an OpenAI Agents SDK agent that runs as a Temporal workflow
(``temporalio.contrib.openai_agents``, the ``temporalio-openai-agents`` package): each
tool call is an operation of onceflow's Nexus service, made from the workflow itself.
Needs the extra: ``pip install 'onceflow-client[openai-agents-temporal]'`` (the
integration currently needs ``openai-agents`` 0.22)::

    from agents import Agent, Runner
    from temporalio import workflow

    with workflow.unsafe.imports_passed_through():
        from onceflow_client.openai_agents_temporal import onceflow_nexus_tools

    # The catalogue, read once outside any workflow (``await client.list_tools()``) and
    # kept with the agent's code, or the tool descriptions written out.
    agent = Agent(name="payments", instructions=..., tools=onceflow_nexus_tools(CATALOGUE))

    @workflow.defn
    class PaymentsAgent:
        @workflow.run
        async def run(self, prompt: str) -> str:
            return (await Runner.run(agent, prompt)).final_output

with ``OpenAIAgentsPlugin`` on the client and the worker, as the integration's docs show.
The tools are plain function tools, not ``activity_as_tool``: their calls are no
activities, so there is no second retry owner and no activity waits while a person
decides. Each call is identified by the caller's workflow and the model's tool-call id
(recorded in the model activity's result, so the same on every replay): the caller's
replays and retries reach the same onceflow task, never a second one. The call returns
when the task ends; a call that parks or awaits approval keeps the workflow waiting
durably until an operator decides (``onceflow reconcile``, ``onceflow approve``), so the
model is never told "error, try again" about an effect that may exist.

What the model reads (the tool's output, the SDK's way to tell a model of an error)::

    succeeded                         the tool's result as JSON
    another call of the intent        "already done: <result>" (nothing ran again)
      answered it
    refused (invalid arguments),      "error: ... nothing was done ...", and that it may
      rejected with no effect           correct the arguments and call again
    denied                            "error: denied by a person: ...", not to retry
    failed, abandoned, not allowed    "error: ...", told plainly, not invited to retry
"""

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

from agents import FunctionTool, RunContextWrapper, UserError
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext
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
)

__all__ = ["ALREADY_DONE", "DEFAULT_ENDPOINT", "onceflow_nexus_tools"]

_MAY_CORRECT = "You may correct the arguments and call it again."


def onceflow_nexus_tools(
    catalogue: Sequence[Mapping[str, Any]],
    *,
    endpoint: str = DEFAULT_ENDPOINT,
    schedule_to_close_timeout: timedelta = timedelta(days=7),
) -> list[FunctionTool]:
    """onceflow's tools (the catalogue given) as function tools whose calls are Nexus
    operations; usable only in a Temporal workflow.

    Args:
        catalogue: Tool descriptions as ``OnceflowClient.list_tools`` returns them
            (``name``, ``description``, ``input_schema``).
        endpoint: The Nexus endpoint routing to onceflow. Default ``onceflow-tools``.
        schedule_to_close_timeout: How long one call may take, a person's decision on a
            parked or approval-awaiting call included. Default 7 days.
    """
    return [_function_tool(spec, endpoint, schedule_to_close_timeout) for spec in catalogue]


def _function_tool(spec: Mapping[str, Any], endpoint: str, timeout: timedelta) -> FunctionTool:
    name = str(spec["name"])
    tool = FunctionTool(
        name=name,
        description=str(spec.get("description") or name),
        params_json_schema=dict(spec.get("input_schema") or {"type": "object"}),
        on_invoke_tool=partial(_call, name, endpoint, timeout),
        # The contract's schema as it is: optional fields stay optional (strict mode would
        # make the model send every field); onceflow validates the arguments.
        strict_json_schema=False,
    )
    # The SDK's default tells the model "error, please try again" of any failure it makes
    # up itself (a timeout a caller sets): never said of a call that may have taken effect.
    return set_function_tool_failure_error_function(tool, _unanswered)


async def _call(
    name: str, endpoint: str, timeout: timedelta, ctx: ToolContext[Any], arguments: str
) -> str:
    """Call the tool as a Nexus operation and wait for its task to end; see the module
    for what the model reads."""
    if not workflow.in_workflow():
        raise UserError(
            "onceflow_nexus_tools call tools from a Temporal workflow (an agent run with "
            "OpenAIAgentsPlugin); elsewhere use onceflow_client.openai_agents"
        )
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError as error:
        return f"error: invalid arguments, nothing was done: not JSON ({error}). {_MAY_CORRECT}"
    if not isinstance(parsed, dict):
        return f"error: invalid arguments, nothing was done: not an object. {_MAY_CORRECT}"
    tools = workflow.create_nexus_client(service=SERVICE, endpoint=endpoint)
    try:
        status = await tools.execute_operation(
            OPERATION,
            operation_input(ctx.tool_call_id, name, parsed),
            output_type=dict,
            schedule_to_close_timeout=timeout,
        )
    except NexusOperationError as error:
        return _output(told_about_refusal(error))
    return _output(told_about_status(status))


def _output(told: Told) -> str:
    """The tool's output the model reads."""
    if told.telling is Telling.RESULT:
        content = told.content
        return content if isinstance(content, str) else json.dumps(content, default=str)
    if told.telling is Telling.RETRY:
        return f"error: {told.content}. {_MAY_CORRECT}"
    return f"error: {told.content}"


def _unanswered(context: RunContextWrapper[Any], error: Exception) -> str:
    return (
        f"error: no answer ({type(error).__name__}). The call may have taken effect: do "
        "not call it again; tell the user it is pending."
    )
