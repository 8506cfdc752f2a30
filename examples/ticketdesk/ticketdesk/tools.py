"""ticketdesk's two onceflow tools: one the help desk dedupes by key, one it cannot.

``create_ticket`` sends the step's derived child key as ``Idempotency-Key`` to
``POST /tickets``, so onceflow may repeat an attempt whose answer was lost (within the
service's key retention) and, if it must stop, looks the ticket up by the key's digest,
which every ticket carries as metadata ``operation``. ``create_ticket_unkeyed`` posts to
``POST /legacy/tickets``, which ignores keys: nothing makes a repeat harmless, so an
unknown outcome parks the task for a person.

Both are registered by configuration (``ONCEFLOW_TOOLS=ticketdesk``, the entry point this
package declares) and reach the service at ``TICKETDESK_URL``.
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
from pydantic import BaseModel, Field
from pydantic_settings import SettingsConfigDict

from onceflow.settings import FileBackedSettings, read_settings
from onceflow.tools import (
    ChildOperation,
    DedupeStrategy,
    EffectFlags,
    OutcomeClass,
    Tool,
    ToolAttemptResult,
    ToolCall,
    ToolContract,
    classify_http_error,
    classify_http_status,
)
from ticketdesk.service import KEY_RETENTION

PROVIDER_ACCOUNT = "ticketdesk"
"""Part of every derived key: another help-desk account would be another key space."""
CHILD_OP = "create"


class TicketdeskSettings(FileBackedSettings):
    """Where the tools reach the help desk (``TICKETDESK_*``, or ``[tools.ticketdesk]``)."""

    config_table = "tools.ticketdesk"
    model_config = SettingsConfigDict(env_prefix="TICKETDESK_", extra="ignore", frozen=True)

    url: str = "http://127.0.0.1:8700"
    """Base URL of the service (``TICKETDESK_URL``). Default ``http://127.0.0.1:8700``,
    where ``python -m ticketdesk.service`` listens."""
    request_timeout: timedelta = Field(default=timedelta(seconds=5), gt=timedelta(0))
    """Longest wait for one request (``TICKETDESK_REQUEST_TIMEOUT``, ISO 8601). A request
    that times out after it was sent counts as unknown. Default 5 s."""


class CreateTicketInput(BaseModel):
    """Arguments of both tools."""

    title: str = Field(min_length=1, max_length=200)
    """One line saying what is wrong."""
    description: str = Field(default="", max_length=4000)
    """Details for whoever picks the ticket up. Default empty."""


@asynccontextmanager
async def open_ticketdesk_client() -> AsyncIterator[httpx.AsyncClient]:
    """The service's HTTP client, once per worker; httpx retries nothing by default."""
    settings = read_settings(TicketdeskSettings)
    async with httpx.AsyncClient(
        base_url=settings.url, timeout=settings.request_timeout.total_seconds()
    ) as client:
        yield client


async def create_ticket(call: ToolCall[CreateTicketInput]) -> ToolAttemptResult:
    """One attempt at ``POST /tickets`` with the step's child key as ``Idempotency-Key``."""
    operation = await call.begin(CHILD_OP, provider_account=PROVIDER_ACCOUNT)
    if operation.earlier_success:
        return operation.earlier_success
    return await _post(call, operation, "/tickets", {"Idempotency-Key": operation.key})


async def create_ticket_unkeyed(call: ToolCall[CreateTicketInput]) -> ToolAttemptResult:
    """One attempt at ``POST /legacy/tickets``, which would create a second ticket if
    repeated: onceflow never repeats it after an unknown outcome."""
    operation = await call.begin(CHILD_OP, provider_account=PROVIDER_ACCOUNT)
    if operation.earlier_success:
        return operation.earlier_success
    return await _post(call, operation, "/legacy/tickets", {})


async def look_up_ticket(call: ToolCall[CreateTicketInput]) -> ToolAttemptResult:
    """Before the step parks: find the ticket by the operation digest in its metadata.

    The ledger is read straight from the service (strongly consistent), so finding no
    ticket proves there is none (``miss_proves_absence``); a failed read proves nothing.
    """
    operation = await call.find(CHILD_OP, provider_account=PROVIDER_ACCOUNT)
    if operation.earlier_success:
        return operation.earlier_success
    try:
        response = await call.client.get("/tickets", params={"operation": operation.key_digest})
    except httpx.HTTPError as error:
        return _inconclusive(operation, f"the lookup failed ({type(error).__name__})")
    if response.status_code != 200:
        return _inconclusive(operation, f"the lookup answered HTTP {response.status_code}")
    found: list[dict[str, Any]] = response.json().get("tickets", [])
    if not found:
        return _inconclusive(operation, "no ticket carries this operation", absent=True)
    ticket = found[0]
    return await operation.succeeded(
        str(ticket["id"]), ticket, ticket_id=str(ticket["id"]), found_by="lookup"
    )


async def _post(
    call: ToolCall[CreateTicketInput],
    operation: ChildOperation,
    path: str,
    headers: dict[str, str],
) -> ToolAttemptResult:
    # The key's digest goes into the ticket's metadata: the lookup, or an operator reading
    # the step's evidence (which shows digests, never keys), finds this step's ticket by it.
    body = {**call.args.model_dump(), "metadata": {"operation": operation.key_digest}}
    try:
        response = await call.client.post(path, json=body, headers=headers)
    except httpx.HTTPError as error:
        outcome, reason = classify_http_error(error)
        return await operation.failed(outcome, reason)
    # Persisted with the outcome, for reconciliation: a replay names the original request.
    ids = {
        name: value
        for name, header in (("request_id", "Request-Id"), ("replayed_from", "Original-Request"))
        if (value := response.headers.get(header))
    }
    outcome, reason = classify_http_status(response.status_code)
    if outcome is not OutcomeClass.SUCCEEDED:
        return await operation.failed(outcome, reason, **ids)
    ticket: dict[str, Any] = response.json()
    return await operation.succeeded(str(ticket["id"]), ticket, ticket_id=str(ticket["id"]), **ids)


def _inconclusive(
    operation: ChildOperation, reason: str, *, absent: bool = False
) -> ToolAttemptResult:
    return ToolAttemptResult(
        outcome=OutcomeClass.UNKNOWN,
        reason=reason,
        evidence=operation.evidence,
        miss_proves_absence=absent,
    )


_ATTEMPT_TIMEOUT = timedelta(seconds=30)
"""Above the client's request timeout, so a slow request ends as the client's own
(classified) timeout rather than Temporal's."""

CREATE_TICKET = Tool(
    contract=ToolContract(
        name="create_ticket",
        description="Open a help-desk ticket (deduplicated by the help desk's Idempotency-Key).",
        input_model=CreateTicketInput,
        effects=EffectFlags(idempotent=True),
        dedupe=DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY,
        provider_key_retention=KEY_RETENTION,
        start_to_close_timeout=_ATTEMPT_TIMEOUT,
    ),
    perform=create_ticket,
    look_up=look_up_ticket,
    open_client=open_ticketdesk_client,
)

CREATE_TICKET_UNKEYED = Tool(
    contract=ToolContract(
        name="create_ticket_unkeyed",
        description="Open a help-desk ticket through the legacy endpoint, which has no "
        "idempotency: a lost answer parks the task for a person to check.",
        input_model=CreateTicketInput,
        effects=EffectFlags(idempotent=False),
        dedupe=DedupeStrategy.NONE,
        start_to_close_timeout=_ATTEMPT_TIMEOUT,
    ),
    perform=create_ticket_unkeyed,
    open_client=open_ticketdesk_client,
)

TOOLS = (CREATE_TICKET, CREATE_TICKET_UNKEYED)
"""What the ``onceflow.tools`` entry point ``ticketdesk`` names."""
