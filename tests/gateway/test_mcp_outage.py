"""The MCP server through a PostgreSQL outage: a call made while the database is cut off
is a tool error an agent can retry (``backend-unavailable``), and the same call, retried
until the database is back, runs once."""

from mcp import Client

from onceflow.gateway.mcp_server import (
    IDEMPOTENCY_KEY_ARGUMENT,
    build_mcp_server,
    fixed_principal,
)
from tests.harness import eventually

from .conftest import Caller, Stack, count, rows
from .outages import fragile_boundary

ORDER = {
    "customer_id": "c-mcp-outage",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}


async def test_an_mcp_call_during_a_database_outage_is_retryable_and_runs_once_after_it(
    stack: Stack, agent: Caller, database: str
) -> None:
    call = {**ORDER, IDEMPOTENCY_KEY_ARGUMENT: "order-mcp-outage-1"}
    async with fragile_boundary(stack) as fragile:
        server = build_mcp_server(fragile.service, fixed_principal(agent.principal))
        async with Client(server) as mcp:
            await fragile.database.stop()
            refused = await mcp.call_tool("create_order", call)
            await fragile.database.start(fragile.database.port)
            # The agent retries with the same key until the boundary has its database.
            answered = await eventually(
                lambda: mcp.call_tool("create_order", call),
                until=lambda result: not result.is_error,
                what="the call answered once the database is back",
                interval=0.5,
            )
            again = await mcp.call_tool("create_order", call)

    problem = refused.structured_content or {}
    assert refused.is_error, refused.structured_content
    assert (problem.get("status"), problem.get("type")) == (
        503,
        "urn:onceflow:problem:backend-unavailable",
    ), problem
    assert not answered.is_error, answered.structured_content
    assert (answered.structured_content or {}).get("state") == "succeeded"
    assert again.structured_content == answered.structured_content
    assert count(database, "orders") == 1
    # The session's task and its one call: each recorded once, both settled (the task as
    # it ends, just after the session closed it).
    await eventually(
        lambda: rows(database, "SELECT state FROM idempotency_records"),
        until=lambda states: states == [("succeeded",)] * 2,
        what=lambda: f"{rows(database, 'SELECT state FROM idempotency_records')}",
    )
