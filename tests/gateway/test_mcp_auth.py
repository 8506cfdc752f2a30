"""MCP over streamable HTTP lets no request through without a valid API key, and lists to a
principal only the tools it may call; over stdio a bad key stops the server at start-up.

The server is ``build_mcp_server(...).streamable_http_app()`` served in this process on the
real stack (``test_mcp.py`` checks the same gate on ``onceflow mcp --transport http``).
Clients are the MCP SDK's own and raw httpx, as a hostile client would send them.
"""

import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from onceflow.gateway.http_server import HttpServer
from onceflow.gateway.mcp_server import (
    SESSION_HEADER,
    TASK_STATUS_TOOL,
    bearer_principal,
    build_mcp_server,
)
from onceflow.tools.worker import CATALOGUE
from tests.harness import HANG_SECONDS

from ..conftest import repo_root
from .conftest import Caller, Stack, count, execute, make_caller, new_tenant, open_service, rows

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "0"},
    },
}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
MCP_ACCEPT = {"Accept": "application/json, text/event-stream"}


@asynccontextmanager
async def mcp_http(stack: Stack) -> AsyncIterator[str]:
    """The MCP server's streamable HTTP app on a free port; yields its ``/mcp`` URL."""
    async with open_service(stack) as service:
        app = build_mcp_server(service, bearer_principal(service)).streamable_http_app(
            host="127.0.0.1"
        )
        server = HttpServer(app, host="127.0.0.1", port=0, handle_signals=False)
        url = await server.start()
        try:
            yield f"{url}/mcp"
        finally:
            await server.stop()


@asynccontextmanager
async def mcp_session(url: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with (
        httpx2.AsyncClient(headers=headers, timeout=HANG_SECONDS) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def assert_unauthenticated(response: httpx.Response, what: str = "") -> None:
    assert response.status_code == 401, (what, response.text)
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="onceflow"', what
    assert response.headers["Content-Type"] == "application/problem+json", what
    assert response.json()["type"] == "urn:onceflow:problem:unauthenticated", what
    assert response.json()["status"] == 401, what
    assert SESSION_HEADER not in response.headers, what


def written(database: str) -> tuple[int, int]:
    return count(database, "idempotency_records"), count(database, "coupon_issuances")


async def test_initialize_without_a_valid_key_is_401_and_opens_nothing(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with mcp_http(stack) as url, httpx.AsyncClient(timeout=HANG_SECONDS) as http:
        refused = {
            "no key": await http.post(url, json=INITIALIZE, headers=MCP_ACCEPT),
            "unknown key": await http.post(
                url,
                json=INITIALIZE,
                headers={**MCP_ACCEPT, "Authorization": f"Bearer ofk_{secrets.token_hex(16)}"},
            ),
            "not an API key": await http.post(
                url, json=INITIALIZE, headers={**MCP_ACCEPT, "Authorization": "Bearer x"}
            ),
            "another scheme": await http.post(
                url,
                json=INITIALIZE,
                headers={**MCP_ACCEPT, "Authorization": f"Basic {agent.api_key}"},
            ),
            "tools/list": await http.post(url, json=LIST_TOOLS, headers=MCP_ACCEPT),
            "GET stream": await http.get(url, headers={"Accept": "text/event-stream"}),
            "DELETE": await http.delete(url, headers={SESSION_HEADER: "0" * 32}),
        }
        # The SDK's client: its initialize fails (raised out of its task groups).
        for headers in ({}, {"Authorization": "Bearer ofk_made-up"}):
            with pytest.raises(ExceptionGroup) as failed:
                async with mcp_session(url, headers):
                    pass
            assert failed.group_contains(MCPError), headers
        # The gate is in front of the SDK, not in place of it: the right key initializes.
        allowed = await http.post(url, json=INITIALIZE, headers={**MCP_ACCEPT, **agent.headers})

    for what, response in refused.items():
        assert_unauthenticated(response, what)
    assert refused["no key"].json()["detail"].startswith("send an API key")
    assert allowed.status_code == 200, allowed.text
    assert allowed.headers[SESSION_HEADER]
    assert written(database) == (0, 0)


async def test_a_session_id_is_no_credential_and_a_revoked_key_is_refused_mid_session(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with mcp_http(stack) as url, httpx.AsyncClient(timeout=HANG_SECONDS) as http:
        async with mcp_session(url, agent.headers) as session:
            assert (await session.list_tools()).tools
            session_id = await _session_id(http, url, agent)
            hijacked = await http.post(
                url, json=LIST_TOOLS, headers={**MCP_ACCEPT, SESSION_HEADER: session_id}
            )
            revoked = execute(
                database,
                "UPDATE api_keys SET revoked_at = now() WHERE principal_id = %s",
                agent.principal.principal_id,
            )
            with pytest.raises(MCPError):
                await session.list_tools()
            with pytest.raises(MCPError):
                await session.call_tool(
                    "issue_coupon", {"user_id": "u", "coupon_id": "C", "idempotency_key": "k-1"}
                )

    assert_unauthenticated(hijacked)
    assert revoked == 1
    assert written(database) == (0, 0)


async def _session_id(http: httpx.AsyncClient, url: str, caller: Caller) -> str:
    """A session of ``caller``'s (a second one, raw), for a request that lacks the key."""
    response = await http.post(url, json=INITIALIZE, headers={**MCP_ACCEPT, **caller.headers})
    assert response.status_code == 200, response.text
    return response.headers[SESSION_HEADER]


async def test_tools_list_shows_only_the_tools_the_principal_may_call(
    stack: Stack, agent: Caller, database: str
) -> None:
    everything = await make_caller(database, tenant=new_tenant(), name="operator", tools=("*",))
    async with mcp_http(stack) as url:
        async with mcp_session(url, agent.headers) as session:
            listed = {tool.name for tool in (await session.list_tools()).tools}
            unlisted = next(c.name for c in CATALOGUE if c.name not in listed)
            refused = await session.call_tool(unlisted, {"idempotency_key": "k-unlisted"})
            coupon = await session.call_tool(
                "issue_coupon", {"user_id": "u-auth", "coupon_id": "C1", "idempotency_key": "k-1"}
            )
        async with mcp_session(url, everything.headers) as session:
            all_listed = {tool.name for tool in (await session.list_tools()).tools}
        # The 2026-07-28 protocol (no session) goes through the same gate and filter.
        async with (
            httpx2.AsyncClient(headers=agent.headers, timeout=HANG_SECONDS) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            stateless = {tool.name for tool in (await client.list_tools()).tools}

    assert listed == stateless == {"issue_coupon", "create_order", TASK_STATUS_TOOL}
    assert all_listed == {contract.name for contract in CATALOGUE} | {TASK_STATUS_TOOL}
    problem: dict[str, Any] = refused.structured_content or {}
    assert refused.is_error and problem["status"] == 403, problem
    assert not coupon.is_error and (coupon.structured_content or {})["state"] == "succeeded"
    assert count(database, "coupon_issuances") == 1
    # The refused call reserved no key: only the coupon's call and its session's task.
    assert sorted(scope.rsplit(":", 1)[-1] for (scope,) in _scopes(database)) == [
        "call",
        "create",
    ]


def _scopes(database: str) -> list[tuple[Any, ...]]:
    return rows(database, "SELECT scope FROM idempotency_records")


async def test_stdio_with_a_bad_key_stops_at_start_with_one_line(
    stack: Stack, database: str
) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "onceflow.cli.main", "mcp"],
        cwd=repo_root(),
        env={**stack.env(), "PATH": "/usr/bin:/bin", "ONCEFLOW_API_KEY": "ofk_made-up"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert started.returncode != 0
    assert started.stdout == ""  # stdout is the MCP client's: nothing but the protocol
    [line] = started.stderr.strip().splitlines()
    assert "API key" in line and "ONCEFLOW_API_KEY" in line, line
    assert "unexpected" not in line and "Traceback" not in started.stderr
