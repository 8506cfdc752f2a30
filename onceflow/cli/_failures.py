"""Turns the failures an operator can meet into one line each: never a traceback."""

from pydantic import ValidationError
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from onceflow.settings import InvalidSettings
from onceflow.task_api import DecisionConflict, DecisionRefused
from onceflow.tools import ToolRegistrationError, UnknownTool


class CommandFailed(Exception):
    """A failure already phrased for the operator."""

    def __init__(self, message: str, *, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def describe_validation_error(error: ValidationError) -> str:
    """All of a validation error's problems on one line."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'input'}: {problem['msg']}"
        for problem in error.errors()
    )


def explain(error: BaseException) -> CommandFailed:
    """The one-line explanation of ``error`` and the exit code to leave with."""
    if isinstance(error, CommandFailed):
        return error
    if isinstance(error, ValidationError):
        return CommandFailed(f"invalid input: {describe_validation_error(error)}", exit_code=2)
    if isinstance(error, InvalidSettings):
        return CommandFailed(str(error), exit_code=2)
    if isinstance(error, ToolRegistrationError):
        return CommandFailed(str(error), exit_code=2)
    if isinstance(error, UnknownTool):
        return CommandFailed(str(error), exit_code=2)
    if isinstance(error, DecisionRefused):
        return CommandFailed(f"refused by the task: {error}")
    if isinstance(error, DecisionConflict):
        return CommandFailed(f"conflict: {error}")
    if isinstance(error, RPCError) and error.status is RPCStatusCode.NOT_FOUND:
        if "already completed" in error.message:
            return CommandFailed("the task has already ended; there is nothing left to decide")
        return CommandFailed(f"not found: {error.message}")
    if isinstance(error, WorkflowQueryFailedError):
        return CommandFailed(f"the task did not answer: {error}")
    if isinstance(error, RuntimeError) and "Failed client connect" in str(error):
        return CommandFailed(
            "cannot reach Temporal (is `onceflow dev` running, or TEMPORAL_ADDRESS set?): "
            f"{str(error).splitlines()[0]}"
        )
    if isinstance(error, OSError):
        return CommandFailed(f"{type(error).__name__}: {error}")
    return CommandFailed(f"unexpected failure ({type(error).__name__}): {error}")
