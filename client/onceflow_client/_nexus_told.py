"""One onceflow tool call made over Nexus from an agent's workflow, whatever the agent
framework: the operation's input, and what the model is told when its task ends. Each
adapter hands a ``Told`` over in its framework's own way (PydanticAI raises a
``ModelRetry`` / ``ToolFailed``; the OpenAI Agents SDK returns the tool's output text)::

    the step                          Told
    succeeded                         RESULT: the tool's result
    another call of the intent        RESULT: "already done: <result>" (nothing ran again)
      answered it
    refused (invalid arguments),      RETRY: nothing happened, fix the arguments
      rejected with no effect
    denied                            FAILED: the person's reason, not to retry
    failed, abandoned, not allowed    FAILED: told plainly, not invited to retry

A parked call or one awaiting approval has no ``Told``: its operation stays open and the
workflow waits until a person decides.
"""

import enum
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from temporalio.exceptions import NexusOperationError

DEFAULT_ENDPOINT = "onceflow-tools"
"""The endpoint ``onceflow dev`` creates."""
SERVICE = "OnceflowTools"
OPERATION = "call_tool"
STEP_ID = "1"
"""A call runs as a one-step task: its step."""
ALREADY_DONE = "already done: "
"""How a call answered by the repeat guard starts: nothing ran for it."""

_CALL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
_NO_EFFECT_OUTCOMES = frozenset({"rejected", "transient"})


class Telling(enum.Enum):
    RESULT = "result"
    """The call's result (a mapping, or the "already done" text)."""
    RETRY = "retry"
    """Nothing happened: the model may correct its arguments and call again."""
    FAILED = "failed"
    """Told plainly; calling again would not help (or would repeat an effect)."""


@dataclass(frozen=True)
class Told:
    """What the model is told about one call: ``content`` is the result for
    ``Telling.RESULT``, else the message."""

    telling: Telling
    content: Any


def call_id(tool_call_id: str) -> str:
    """The operation's ``call_id`` for a model's tool-call id: itself when it fits
    onceflow's pattern, else a digest of it."""
    if _CALL_ID.fullmatch(tool_call_id):
        return tool_call_id
    return "c." + hashlib.sha256(tool_call_id.encode()).hexdigest()[:48]


def operation_input(tool_call_id: str, tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """``OnceflowTools.call_tool``'s input (a ``NexusToolCall``) for one model's call."""
    return {"call_id": call_id(tool_call_id), "tool": tool, "arguments": dict(arguments)}


def told_about_status(status: Mapping[str, Any]) -> Told:
    """What the model is told about the call whose task ended with ``status``."""
    steps = status.get("steps") or []
    step = next((step for step in steps if step.get("step_id") == STEP_ID), None)
    if step is None:
        return Told(
            Telling.FAILED, f"onceflow's task answered without its step: {status.get('state')}"
        )
    return told_about_step(step)


def told_about_step(step: Mapping[str, Any]) -> Told:
    """What the model is told about a step that ended."""
    state = str(step.get("state"))
    result = dict(step.get("result") or {})
    if state == "succeeded":
        if not result and step.get("resource_id"):
            result = {"resource_id": step["resource_id"]}
        if "repeat_of" in result:
            return Told(
                Telling.RESULT, ALREADY_DONE + json.dumps(result, sort_keys=True, default=str)
            )
        return Told(Telling.RESULT, result)
    reason = step.get("failure_reason") or state
    if state == "denied":
        return Told(Telling.FAILED, f"denied by a person: {reason}. Do not call it again for this.")
    if state == "abandoned":
        return Told(
            Telling.FAILED,
            f"abandoned by an operator: {reason}. Whether it took effect is for a person "
            "to settle; do not call it again.",
        )
    outcomes = [str(attempt.get("outcome")) for attempt in step.get("attempts") or []]
    if outcomes and outcomes[-1] == "rejected" and set(outcomes) <= _NO_EFFECT_OUTCOMES:
        return Told(Telling.RETRY, f"rejected, nothing was done: {reason}")
    return Told(
        Telling.FAILED,
        f"failed: {reason}. onceflow has retried it as far as its budget allows; calling "
        "it again will not help.",
    )


def told_about_refusal(error: "NexusOperationError") -> Told:
    """onceflow refused the call before anything started: the model may fix invalid
    arguments; anything else (a tool not allowed, a call id reused) it cannot."""
    cause = error.cause
    message = str(getattr(cause, "message", None) or cause or error)
    if "invalid request" in message or "arguments cannot be taken" in message:
        return Told(Telling.RETRY, f"invalid arguments, nothing was done: {message}")
    return Told(Telling.FAILED, f"refused, nothing was done: {message}")
