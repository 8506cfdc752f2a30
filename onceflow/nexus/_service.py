"""The ``OnceflowTools`` Nexus service's contract: its operations and their inputs.

A caller workflow needs only this module (and ``onceflow.workflows.task_models`` for the
result) to call onceflow through ``workflow.create_nexus_client``; the handler side is
``onceflow.nexus._handler``. Each operation's result is the onceflow task's final
``TaskStatus``: the workflow that backs the operation is the task itself, and its result
is what Temporal's completion callback delivers to the caller.
"""

from typing import Any

import nexusrpc
from pydantic import BaseModel, ConfigDict, Field

from onceflow.workflows.task_models import NAME_PATTERN, StepInput, TaskStatus

SERVICE_NAME = "OnceflowTools"
"""The service's name on every endpoint that serves it."""
DEFAULT_ENDPOINT = "onceflow-tools"
"""The endpoint ``onceflow dev`` creates (``ensure_nexus_endpoint``)."""


class NexusToolCall(BaseModel):
    """One tool call, run as a one-step onceflow task (step ``TOOL_CALL_STEP_ID``)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    call_id: str = Field(pattern=NAME_PATTERN)
    """The caller's name for this call, stable across its replays and retries (a model's
    tool call id, or a counter the caller's workflow keeps). With the caller's namespace
    and workflow id (from the request's link to the caller) it is the call's identity:
    the same identity is always the same onceflow task, never a second one."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    deliberate_repeat: bool = False
    """A second effect identical to an earlier call's, on purpose (the tool's contract
    must allow it). Default false: a repeat of one intent is answered by its first call."""


class NexusPlan(BaseModel):
    """A whole plan, run as one onceflow task under one retry budget."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    call_id: str = Field(pattern=NAME_PATTERN)
    """As ``NexusToolCall.call_id``."""
    steps: list[StepInput] = Field(min_length=1, max_length=50)


@nexusrpc.service(name=SERVICE_NAME)
class OnceflowTools:
    """onceflow's tools as Nexus operations; each completes when its task ends, and stays
    open while a step is parked or awaits approval (the caller waits durably)."""

    call_tool: nexusrpc.Operation[NexusToolCall, TaskStatus]
    run_plan: nexusrpc.Operation[NexusPlan, TaskStatus]
