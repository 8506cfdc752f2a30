"""The public API for bringing your own tool to onceflow.

A tool is a ``Tool``: a ``ToolContract`` (what it does to the world and what makes a
repeat safe) plus an async ``perform`` function, optionally a ``look_up`` and an
``open_client``. Put it in your own package and name it in configuration
(``ONCEFLOW_TOOLS=package.module:TOOL`` or an ``onceflow.tools`` entry point); the
worker, the gateway and the MCP server load it at start-up and refuse it, with a fix,
if it is unsafe: no attempt timeout, an ``idempotent`` claim with no dedupe strategy, a
client that retries on its own. A ``ToolFamily`` groups a package's tools with what
onceflow must know about their service: the settings a worker cannot start without
(``StartupProblem``), the secrets to keep out of logs, traces and histories
(``Redaction``), how to see that its client library retries nothing
(``ClientRetryCheck``). onceflow's own tools are families loaded the same way.

A minimal tool (``examples/ticketdesk`` has the whole of it)::

    from collections.abc import AsyncIterator
    from contextlib import asynccontextmanager
    from datetime import timedelta

    import httpx
    from pydantic import BaseModel

    from onceflow.tools import (
        DedupeStrategy, EffectFlags, OutcomeClass, Tool, ToolAttemptResult, ToolCall,
        ToolContract, classify_http_error, classify_http_status,
    )

    class CreateTicket(BaseModel):
        title: str

    @asynccontextmanager
    async def open_desk() -> AsyncIterator[httpx.AsyncClient]:
        async with httpx.AsyncClient(base_url="http://127.0.0.1:8700", timeout=5) as desk:
            yield desk  # httpx does not retry by default; keep it that way

    async def create_ticket(call: ToolCall[CreateTicket]) -> ToolAttemptResult:
        operation = await call.begin("create", provider_account="ticketdesk")
        if operation.earlier_success:
            return operation.earlier_success
        try:
            response = await call.client.post(
                "/tickets", json=call.args.model_dump(),
                headers={"Idempotency-Key": operation.key},
            )
        except httpx.HTTPError as error:
            return await operation.failed(*classify_http_error(error))
        outcome, reason = classify_http_status(response.status_code)
        if outcome is not OutcomeClass.SUCCEEDED:
            return await operation.failed(outcome, reason)
        ticket = response.json()
        return await operation.succeeded(ticket["id"], ticket)

    CREATE_TICKET = Tool(
        contract=ToolContract(
            name="create_ticket",
            description="Open a ticket at the help desk.",
            input_model=CreateTicket,
            effects=EffectFlags(idempotent=True),
            dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
            provider_key_retention=timedelta(hours=24),
            start_to_close_timeout=timedelta(seconds=10),
        ),
        perform=create_ticket,
        open_client=open_desk,
    )

Everything here is for a tool author. The side of the processes that serve tools (the
catalogue and its registration, the tools' activities, pinned policies, derived
identities) is ``onceflow.tools.worker``; the providers' fleet state is
``onceflow.tools.providers``. The full walk-through is docs/add-your-own-tool.md; the
reference is docs/tool-api.md, generated from these docstrings.
"""

from onceflow.retry_policy import OutcomeClass
from onceflow.storage import autocommit, classify_database_error
from onceflow.tools._attempts import ToolAttemptResult
from onceflow.tools._audit import (
    AuditFinding,
    Auditor,
    AuditProgress,
    AuditReport,
    AuditWindow,
    EffectTotal,
    FindingKind,
    OperationRecord,
    ProviderUnreadable,
    read_operations,
    read_step_operations,
)
from onceflow.tools._call import ToolCall
from onceflow.tools._checks import ToolRegistrationError
from onceflow.tools._child_operation import (
    DEFAULT_HEARTBEAT_EVERY,
    DEFAULT_LEASE_TTL,
    ChildOperation,
    LocalWrite,
)
from onceflow.tools._classify import (
    DatabaseUnavailable,
    NothingSent,
    classify_http_error,
    classify_http_status,
)
from onceflow.tools._contract import ApprovalThreshold, DedupeStrategy, EffectFlags, ToolContract
from onceflow.tools._family import ClientRetryCheck, Redaction, StartupProblem, ToolFamily
from onceflow.tools._intent import IntentIdentity
from onceflow.tools._lease import Lease, LeaseLost
from onceflow.tools._provider import Provider
from onceflow.tools._tool import ClientOpener, Implementation, Tool

__all__ = [
    "DEFAULT_HEARTBEAT_EVERY",
    "DEFAULT_LEASE_TTL",
    "ApprovalThreshold",
    "AuditFinding",
    "AuditProgress",
    "AuditReport",
    "AuditWindow",
    "Auditor",
    "ChildOperation",
    "ClientOpener",
    "ClientRetryCheck",
    "DatabaseUnavailable",
    "DedupeStrategy",
    "EffectFlags",
    "EffectTotal",
    "FindingKind",
    "Implementation",
    "IntentIdentity",
    "Lease",
    "LeaseLost",
    "LocalWrite",
    "NothingSent",
    "OperationRecord",
    "OutcomeClass",
    "Provider",
    "ProviderUnreadable",
    "Redaction",
    "StartupProblem",
    "Tool",
    "ToolAttemptResult",
    "ToolCall",
    "ToolContract",
    "ToolFamily",
    "ToolRegistrationError",
    "autocommit",
    "classify_database_error",
    "classify_http_error",
    "classify_http_status",
    "read_operations",
    "read_step_operations",
]
