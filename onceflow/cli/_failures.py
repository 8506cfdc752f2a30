"""Turns the failures an operator can meet into one line each (never a traceback) and the
exit code that says what kind of failure it was (``ExitCode``)."""

import re
from enum import IntEnum

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import ValidationError
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from onceflow.encryption import ENCRYPTED_ENCODING, PayloadDecryptionFailed
from onceflow.errors import OnceflowError, describe_validation
from onceflow.settings import InvalidSettings
from onceflow.task_api import DecisionConflict, DecisionRefused
from onceflow.tools import ToolRegistrationError
from onceflow.tools.worker import UnknownTool


class ExitCode(IntEnum):
    """How a command that fails leaves, so a script or a supervisor can tell what to do.

    Codes 3, 4 and 5 belong to ``call --wait`` (the task's state) and 6 to ``audit`` (it
    found something), so a dependency that is down or refused credentials use the
    ``sysexits.h`` numbers instead of the next small ones: a supervisor restarts on
    ``UNAVAILABLE`` and gives up on ``BAD_INPUT`` and ``CREDENTIALS_REFUSED``, which no
    restart fixes.
    """

    FAILED = 1
    """Anything else: a refused decision, a conflict, a port or state folder in use."""
    BAD_INPUT = 2
    """Bad input or settings (a missing one included); the line names the fix."""
    UNAVAILABLE = 69
    """Temporal or PostgreSQL cannot be reached (``EX_UNAVAILABLE``); retrying may work."""
    CREDENTIALS_REFUSED = 77
    """An API key, database password or Temporal credential was refused (``EX_NOPERM``)."""
    INTERRUPTED = 130
    """Stopped by SIGINT/SIGTERM before it was ready."""


EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 failed (a refused decision, a conflict, a port or state folder "
    "in use); 2 bad input or settings; 69 Temporal or PostgreSQL unreachable; 77 "
    "credentials refused (API key, database password, Temporal); 130 interrupted before "
    "ready; call --wait: 3 task failed, 4 parked, 5 awaiting approval; audit: 6 findings "
    "(a duplicate, an orphan or a missing resource)."
)
"""The exit codes as ``onceflow --help`` lists them."""


class CommandFailed(OnceflowError):
    """A failure already phrased for the operator."""

    code = "command-failed"
    title = "Command failed"

    def __init__(self, message: str, *, exit_code: int = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = int(exit_code)


def explain(error: BaseException) -> CommandFailed:
    """The one-line explanation of ``error`` and the exit code to leave with."""
    if isinstance(error, CommandFailed):
        return error
    if isinstance(error, ValidationError):
        return CommandFailed(
            f"invalid input: {describe_validation(error)}", exit_code=ExitCode.BAD_INPUT
        )
    if isinstance(error, InvalidSettings | ToolRegistrationError | UnknownTool):
        return CommandFailed(str(error), exit_code=ExitCode.BAD_INPUT)
    if isinstance(error, PayloadDecryptionFailed):
        return CommandFailed(str(error), exit_code=ExitCode.BAD_INPUT)
    if isinstance(error, KeyError) and ENCRYPTED_ENCODING.decode() in str(error):
        return CommandFailed(
            "the task's payloads are encrypted and this command has no key; fix: set "
            "ONCEFLOW_PAYLOAD_KEYS to the keys the workers use",
            exit_code=ExitCode.BAD_INPUT,
        )
    if isinstance(error, DecisionRefused):
        return CommandFailed(f"refused by the task: {error}")
    if isinstance(error, DecisionConflict):
        return CommandFailed(f"conflict: {error}")
    if isinstance(error, RPCError):
        return _explain_temporal_rpc(error)
    if isinstance(error, WorkflowQueryFailedError):
        return CommandFailed(f"the task did not answer: {error}")
    if isinstance(error, RuntimeError) and "Failed client connect" in str(error):
        return temporal_unreachable(str(error))
    if isinstance(error, psycopg.OperationalError):
        return database_unreachable(error)
    if isinstance(error, PoolTimeout):
        return CommandFailed(
            "no PostgreSQL connection could be made in time (DATABASE_URL); fix: check that "
            "the server is up and reachable from here",
            exit_code=ExitCode.UNAVAILABLE,
        )
    if isinstance(error, OSError):
        return CommandFailed(f"{type(error).__name__}: {error}")
    return CommandFailed(f"unexpected failure ({type(error).__name__}): {error}")


def _explain_temporal_rpc(error: RPCError) -> CommandFailed:
    if error.status is RPCStatusCode.NOT_FOUND:
        if "already completed" in error.message:
            return CommandFailed("the task has already ended; there is nothing left to decide")
        return CommandFailed(f"not found: {error.message}")
    if error.status in (RPCStatusCode.UNAUTHENTICATED, RPCStatusCode.PERMISSION_DENIED):
        return CommandFailed(
            f"Temporal refused the credentials: {error.message}; fix: check TEMPORAL_API_KEY, "
            "the TLS client certificate and TEMPORAL_NAMESPACE",
            exit_code=ExitCode.CREDENTIALS_REFUSED,
        )
    if error.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return temporal_unreachable(error.message)
    return CommandFailed(f"Temporal answered {error.status.name}: {error.message}")


def temporal_unreachable(detail: str) -> CommandFailed:
    """Temporal's client could not connect; ``detail`` is its (Rust, one-line) error."""
    where = re.search(r'ConnectError\("[^"]*", ([\w.:\[\]-]+:\d+),', detail)
    reason = re.findall(r'(?:message|error): "([^"]+)"', detail)
    kind = re.search(r'ConnectError\("([^"]+)"', detail)
    said = reason[-1] if reason else (kind.group(1) if kind else detail.splitlines()[0])
    return CommandFailed(
        f"cannot reach Temporal{f' at {where.group(1)}' if where else ''}: {said}; fix: start "
        "it (or `onceflow dev`), or point TEMPORAL_ADDRESS or --temporal-address at its "
        "frontend",
        exit_code=ExitCode.UNAVAILABLE,
    )


# libpq reports no SQLSTATE for a connection the server refused, so its message is all
# there is to tell credentials from an outage; a message these miss (another server
# language) still leaves as unreachable, on one line.
_CREDENTIALS_REFUSED = ("password authentication failed", "no pg_hba.conf entry", 'role "')
_NO_SUCH_DATABASE = re.compile(r'database "[^"]*" does not exist')


def database_unreachable(error: psycopg.OperationalError) -> CommandFailed:
    """A connection to PostgreSQL failed: refused credentials, a missing database, or an
    outage (the default)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    said = (lines[0] if lines else type(error).__name__).removeprefix("connection failed: ")
    said = " ".join(said.split())  # libpq pads "FATAL:  ..." with two spaces
    if any(marker in said for marker in _CREDENTIALS_REFUSED):
        return CommandFailed(
            f"PostgreSQL refused the credentials in DATABASE_URL: {said}; fix: correct the "
            "user and password in DATABASE_URL",
            exit_code=ExitCode.CREDENTIALS_REFUSED,
        )
    if _NO_SUCH_DATABASE.search(said):
        return CommandFailed(
            f"DATABASE_URL names a database that does not exist: {said}; fix: create it "
            "(createdb) or correct DATABASE_URL",
            exit_code=ExitCode.BAD_INPUT,
        )
    return CommandFailed(
        f"cannot reach PostgreSQL (DATABASE_URL): {said}; fix: start it, or point "
        "DATABASE_URL at your PostgreSQL (`source .onceflow/dev.env` to join `onceflow dev`)",
        exit_code=ExitCode.UNAVAILABLE,
    )
