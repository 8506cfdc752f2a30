"""The MCP server (``onceflow mcp``) with the MCP SDK's own client, over stdio and HTTP.

The server goes through the same boundary service as the HTTP API: same claims, same
fingerprints, same records. One MCP session is one open task (its first call opens it,
its end closes it): ``open_tasks/test_mcp.py`` has the session's own tests.
"""

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from onceflow.gateway.mcp_server import REPLAYED_META, TASK_STATUS_TOOL
from onceflow.tools.worker import CATALOGUE
from tests.harness import HANG_SECONDS, eventually, log_line_blocking

from ..conftest import repo_root
from .conftest import Caller, Stack, count, rows

ORDER = {
    "customer_id": "c-mcp",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 3, "unit_price_cents": 1100}],
}


@asynccontextmanager
async def stdio_session(stack: Stack, api_key: str) -> AsyncIterator[ClientSession]:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "onceflow.cli.main", "mcp"],
        env={**stack.env(), "ONCEFLOW_API_KEY": api_key},
        cwd=str(repo_root()),
    )
    async with stdio_client(server) as (read_stream, write_stream):
        async with ClientSession(read_stream, write_stream) as session:
            await session.initialize()
            yield session


async def test_stdio_lists_the_principals_tools_with_their_contracts_and_calls_once_per_key(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with stdio_session(stack, agent.api_key) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}

        # The tools the principal may call, and the status tool: no other tool's schema.
        assert set(listed) == {*agent.principal.allowed_tools, TASK_STATUS_TOOL}
        for contract in (CATALOGUE.get(name) for name in agent.principal.allowed_tools):
            tool = listed[contract.name]
            expected = contract.mcp_annotations()
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is expected["readOnlyHint"]
            assert tool.annotations.destructive_hint is expected["destructiveHint"]
            assert tool.annotations.idempotent_hint is expected["idempotentHint"]
            assert tool.annotations.open_world_hint is expected["openWorldHint"]
            assert "idempotency_key" in tool.input_schema["required"]
            assert tool.input_schema["properties"]["idempotency_key"]["maxLength"] == 200
        assert listed[TASK_STATUS_TOOL].annotations.read_only_hint is True

        arguments = {**ORDER, "idempotency_key": "mcp-order-1"}
        first = await session.call_tool("create_order", arguments)
        second = await session.call_tool("create_order", arguments)

        status = await session.call_tool(
            TASK_STATUS_TOOL, {"task_id": first.structured_content["task_id"]}
        )

    assert not first.is_error and not second.is_error
    assert first.structured_content == second.structured_content
    assert first.structured_content["state"] == "succeeded"
    assert first.meta[REPLAYED_META] is False
    assert second.meta[REPLAYED_META] is True
    assert status.structured_content["steps"][0]["arguments"] == ORDER
    assert count(database, "orders") == 1
    # The session's task (opened by its first call) and the call's key: one record each.
    assert record_kinds(database) == ["call", "create"]
    assert await stack.task_workflows(agent.principal.tenant) == 1
    # The server's input closed, so its one session ended: its task closes, and stores
    # its final view for the key that opened it.
    await eventually(
        lambda: rows(
            database,
            "SELECT state, response_body->>'state' FROM idempotency_records WHERE workflow_id = %s",
            first.structured_content["task_id"],
        ),
        until=lambda found: found == [("succeeded", "closed")],
        what="the stdio session's task closes once the server's input closed",
    )


def record_kinds(database: str) -> list[str]:
    """The operation of every idempotency record (``create`` for a task, ``call``...)."""
    return sorted(
        scope.rsplit(":", 1)[-1]
        for (scope,) in rows(database, "SELECT scope FROM idempotency_records")
    )


async def test_stdio_refusals_are_tool_errors_with_the_problem(
    stack: Stack, agent: Caller, database: str
) -> None:
    async with stdio_session(stack, agent.api_key) as session:
        missing = await session.call_tool("create_order", ORDER)
        control = await session.call_tool(
            "create_order", {**ORDER, "idempotency_key": "bad\x00key\x1b"}
        )
        await session.call_tool("create_order", {**ORDER, "idempotency_key": "mcp-reuse"})
        reused = await session.call_tool(
            "create_order", {**ORDER, "customer_id": "c-other", "idempotency_key": "mcp-reuse"}
        )
        with pytest.raises(MCPError):
            await session.call_tool("launch_rocket", {"idempotency_key": "k"})

    assert missing.is_error
    assert missing.structured_content["type"].endswith("idempotency-key-missing")
    assert control.is_error
    assert control.structured_content["type"].endswith("idempotency-key-malformed")
    assert reused.is_error
    assert reused.structured_content["status"] == 422
    assert count(database, "orders") == 1
    # The refused calls reserved nothing; the one call made opened the session's task.
    assert record_kinds(database) == ["call", "create"]


def start_mcp_http(stack: Stack, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    log = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "onceflow.cli.main", "mcp", "--transport", "http", "--port", "0"],
        cwd=repo_root(),
        env={**os.environ, **stack.env()},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    ready = "onceflow MCP server ready on "
    try:
        line = log_line_blocking(process, log_path, ready)
    except BaseException:
        process.kill()
        raise
    return process, line.split(ready, 1)[1].split()[0]


async def test_streamable_http_authenticates_each_request_with_its_bearer_key(
    stack: Stack, agent: Caller, database: str, tmp_path: Path
) -> None:
    process, url = start_mcp_http(stack, tmp_path / "mcp.log")
    try:
        async with httpx2.AsyncClient(headers=agent.headers, timeout=HANG_SECONDS) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    result = await session.call_tool(
                        "issue_coupon",
                        {"user_id": "u-mcp", "coupon_id": "C1", "idempotency_key": "mcp-http"},
                    )
        # Without a key not even initialize reaches the SDK (test_mcp_auth.py has the rest).
        async with httpx2.AsyncClient(timeout=HANG_SECONDS) as http:
            nobody = await http.post(
                url,
                json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                headers={"Accept": "application/json, text/event-stream"},
            )
    finally:
        process.terminate()
        process.wait(timeout=HANG_SECONDS)

    assert not result.is_error
    assert result.structured_content["state"] == "succeeded"
    assert nobody.status_code == 401
    assert nobody.headers["WWW-Authenticate"] == 'Bearer realm="onceflow"'
    assert count(database, "coupon_issuances") == 1
