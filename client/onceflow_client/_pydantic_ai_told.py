"""What a PydanticAI model is told about an onceflow call that ended, was refused, or got
no answer: a result, a ``ModelRetry`` (nothing happened, fix the arguments) or a
``ToolFailed`` (told plainly, never invited to retry an effect that may exist)."""

import json
from typing import Any

import httpx
from pydantic_ai import ModelRetry
from pydantic_ai.exceptions import ToolFailed

from onceflow_client._client import (
    CallRefused,
    CallResult,
    OnceflowError,
    OpenTask,
    RequestInProgress,
)

ALREADY_DONE = "already done: "
"""How a call answered by the repeat guard starts: nothing ran for it."""

_UNANSWERED_PROBLEMS = frozenset(
    {"backend-unavailable", "key-quota-exceeded", "task-busy", "task-unanswered"}
)
"""Answers after which the call may or may not have reached the task: ask again later."""
_NO_EFFECT_OUTCOMES = frozenset({"rejected", "transient"})


async def told(task: OpenTask, answer: CallResult) -> Any:
    """What the model is told about a call that ended: its result, or a ``ModelRetry`` /
    ``ToolFailed`` (returned, for the caller to raise or hand over)."""
    if answer.succeeded:
        result = answer.result or (
            {"resource_id": answer.resource_id} if answer.resource_id else {}
        )
        if answer.repeat_of is not None:
            return ALREADY_DONE + json.dumps(result, sort_keys=True, default=str)
        return result
    reason = answer.failure_reason or answer.state
    if answer.state == "denied":
        return ToolFailed(denial(answer))
    if answer.state == "abandoned":
        return ToolFailed(
            f"abandoned by an operator: {reason}. Whether it took effect is for a person "
            "to settle; do not call it again."
        )
    if await _had_no_effect(task, answer):
        return ModelRetry(f"rejected, nothing was done: {reason}")
    return ToolFailed(
        f"failed: {reason}. onceflow has retried it as far as its budget allows; calling "
        "it again will not help."
    )


def denial(answer: CallResult) -> str:
    """What the model is told about a denied call: the person's reason, and not to retry."""
    reason = answer.failure_reason or answer.state
    return f"denied by a person: {reason}. Do not call it again for this."


async def _had_no_effect(task: OpenTask, answer: CallResult) -> bool:
    """Whether a failed call was refused outright: its arguments were invalid, or every
    attempt was known to change nothing and the last was a permanent rejection."""
    status = await task.status()
    step_id = answer.repeat_of or answer.step_id
    step = next((s for s in status.get("steps", []) if s.get("step_id") == step_id), None)
    if step is None:
        return False
    outcomes = [str(attempt.get("outcome")) for attempt in step.get("attempts", [])]
    if not outcomes:
        return "invalid arguments" in str(step.get("failure_reason") or "")
    return outcomes[-1] == "rejected" and set(outcomes) <= _NO_EFFECT_OUTCOMES


def told_about_refusal(failure: Exception) -> ModelRetry | ToolFailed | None:
    """What the model is told when the gateway refused the call before anything was
    recorded; None when no answer came and the call may have reached the task."""
    if isinstance(failure, httpx.TransportError | RequestInProgress):
        return None
    assert isinstance(failure, OnceflowError)
    if isinstance(failure, CallRefused):
        return ToolFailed(f"refused, nothing was done: {failure.reason}")
    if failure.problem_type == "invalid-request":
        return ModelRetry(f"invalid arguments, nothing was done: {_problem_text(failure)}")
    if failure.problem_type in ("tool-not-allowed", "unknown-tool"):
        return ToolFailed(f"not available, nothing was done: {_problem_text(failure)}")
    if failure.problem_type in _UNANSWERED_PROBLEMS or failure.status >= 500:
        return None
    # Anything else (a key reused for another call, bad credentials) is the program's
    # mistake, not the model's: it ends the run.
    raise failure


def _problem_text(failure: OnceflowError) -> str:
    detail = str(failure.problem.get("detail") or failure.problem.get("title") or "")
    errors = failure.problem.get("errors") or []
    where = "; ".join(
        f"{'.'.join(str(part) for part in error.get('loc', [])) or 'arguments'}: "
        f"{error.get('msg', '')}"
        for error in errors
        if isinstance(error, dict)
    )
    return f"{detail} ({where})" if where else detail


def describe_failure(failure: Exception) -> str:
    """Why a call has no answer yet, for the deferred call's metadata."""
    if isinstance(failure, OnceflowError):
        return f"onceflow answered {failure.status} {failure.problem_type}"
    return f"onceflow's answer was lost ({type(failure).__name__})"


async def reconcile_command(task: OpenTask, answer: CallResult) -> str | None:
    """The command an operator runs to decide a parked call, when the status has it."""
    try:
        status = await task.status()
    except (OnceflowError, httpx.HTTPError):
        return None  # the command is a courtesy; the call's state is what matters
    for step in status.get("steps", []):
        if step.get("step_id") == (answer.repeat_of or answer.step_id):
            command = step.get("reconcile_command")
            return str(command) if command else None
    return None
