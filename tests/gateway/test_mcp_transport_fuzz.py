"""The MCP tools fuzzed through the server's own transports, as a remote client reaches
them: ``onceflow mcp`` over stdio and ``onceflow mcp --transport http``, each one
long session of the MCP SDK's client, so one open task takes every call of the run.

The in-process fuzzing (``test_mcp_fuzz.py``) tries many more examples; these add what
only a real process shows: the framing of each transport, the Bearer key checked per HTTP
request, and the server staying up whatever it is sent. Whatever comes in: no internal
error, a refusal before the task (400, 403, 404, 422, 429) writes nothing, and no refusal
echoes the raw key. A call the task itself refuses (409, its budget spent, say) is kept
as that key's answer, by design.

Hypothesis runs in a thread of its own and sends each call to the session, which lives in
the test's event loop.
"""

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from onceflow.gateway.mcp_server import IDEMPOTENCY_KEY_ARGUMENT, TASK_STATUS_TOOL
from onceflow.tools.worker import CATALOGUE
from tests.harness import HANG_SECONDS

from .conftest import Caller, Stack, make_caller, new_tenant
from .test_mcp import start_mcp_http, stdio_session
from .test_mcp_fuzz import ALLOWED, TOOL_NAMES, arguments, written

EXAMPLES = 40
"""Per transport: each is a real round trip through a server process."""
STORED_REFUSAL = "urn:onceflow:problem:call-refused"
"""The task's own refusal of a call, stored as the key's answer."""


@asynccontextmanager
async def http_session(
    stack: Stack, caller: Caller, log_path: Path
) -> AsyncIterator[ClientSession]:
    """A session with an ``onceflow mcp --transport http`` process, as ``caller``."""
    process, url = start_mcp_http(stack, log_path)
    try:
        async with httpx2.AsyncClient(headers=caller.headers, timeout=60) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    yield session
    finally:
        process.terminate()
        process.wait(timeout=HANG_SECONDS)


def judge(
    tool: str,
    call: dict[str, Any],
    answer: types.CallToolResult | MCPError,
    before: tuple[Any, ...],
    after: tuple[Any, ...],
) -> None:
    """What the server may answer to a fuzzed call, and what it may write for it."""
    key = call.get(IDEMPOTENCY_KEY_ARGUMENT)
    echoable = isinstance(key, str) and len(key) >= 12
    if isinstance(answer, MCPError):
        event("protocol error")
        # Only a tool that does not exist is a protocol error, never an internal one.
        assert answer.error.code == INVALID_PARAMS, answer
        assert tool not in CATALOGUE
        assert after == before
        assert not echoable or key not in str(answer)
        return
    body = answer.structured_content or {}
    text = "".join(getattr(part, "text", "") for part in answer.content)
    if answer.is_error and "type" in body and "status" in body:
        event(f"problem {body['type'].rsplit(':', 1)[-1]}")
        assert body["type"].startswith("urn:onceflow:problem:"), body
        assert 400 <= body["status"] < 500, body
        if body["type"] != STORED_REFUSAL:
            assert after == before, f"a refused call ({body['type']}) wrote something"
        assert not echoable or (key not in text and key not in json.dumps(body))
    else:
        event(f"state {body.get('state')}")
        # Accepted: a call's view (possibly failed for want of a provider), never a crash.
        assert "state" in body or tool == TASK_STATUS_TOOL, body


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_fuzzed_calls_over_each_transport_get_no_internal_error_and_refusals_write_nothing(
    transport: str, stack: Stack, database: str, tmp_path: Path
) -> None:
    fuzzer = await make_caller(database, tenant=new_tenant(), name="mcp-fuzzer", tools=ALLOWED)
    opened = (
        stdio_session(stack, fuzzer.api_key)
        if transport == "stdio"
        else http_session(stack, fuzzer, tmp_path / "mcp.log")
    )
    loop = asyncio.get_running_loop()
    answered = 0
    async with opened as session:

        async def send(tool: str, call: dict[str, Any]) -> types.CallToolResult | MCPError:
            try:
                return await session.call_tool(tool, call)
            except MCPError as error:
                return error

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            phases=[Phase.generate],
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            nonlocal answered
            tool = data.draw(TOOL_NAMES, label="tool")
            call = data.draw(arguments(tool), label="arguments")
            before = written(database)
            answer = asyncio.run_coroutine_threadsafe(send(tool, call), loop).result(timeout=60)
            judge(tool, call, answer, before, written(database))
            answered += 1

        await asyncio.to_thread(fuzz)
        # The server is still up and serving the same session after all of it.
        listed = {tool.name for tool in (await session.list_tools()).tools}
    assert answered == EXAMPLES
    assert set(ALLOWED) <= listed
