"""Refuse clients that retry on their own: one layer (the workflow's budget) owns retries.

A client's hidden retry repeats a request the workflow counts as one attempt, outside
the budget and, for a request without an idempotency key, possibly doubling the effect.
onceflow can see the retry settings of httpx and requests/urllib3 clients, and of every
library a loaded tool family declares a ``ClientRetryCheck`` for (the payment tools':
Stripe); a client it cannot inspect is the tool author's responsibility.
"""

from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

from onceflow.tools._checks import Problem, refuse
from onceflow.tools._family import ClientRetryCheck, loaded_client_checks
from onceflow.tools._tool import Tool


async def open_tool_client(tool: Tool, clients: AsyncExitStack) -> Any:
    """Open ``tool``'s client for as long as ``clients`` stays open; None without one.

    Raises:
        ToolRegistrationError: The client (or a client it holds) retries on its own.
    """
    if tool.open_client is None:
        return None
    client = await clients.enter_async_context(tool.open_client())
    refuse_retrying_client(tool.name, client)
    return client


def refuse_retrying_client(tool_name: str, client: Any) -> None:
    """Raise ``ToolRegistrationError`` when ``client`` (or a client it holds) retries on
    its own: the task's budget owns every retry."""
    problems = client_retry_problems(client)
    if problems:
        raise refuse(tool_name, problems)


def client_retry_problems(client: Any) -> list[Problem]:
    """The retry settings left on in ``client`` or in the clients it holds (one level),
    as the libraries onceflow knows and the loaded families' ``client_checks`` see them."""
    checks = {check.module: check for check in (*_LIBRARY_CHECKS, *loaded_client_checks())}
    problems: list[Problem] = []
    for label, candidate in _candidates(client, checks):
        check = checks.get(type(candidate).__module__.split(".")[0])
        retries = check.retries(candidate) if check is not None else None
        if check is not None and retries:
            problems.append(
                (
                    f"its client {label + ' ' if label else ''}({type(candidate).__name__}) "
                    f"retries on its own ({retries})",
                    check.fix,
                )
            )
    return problems


def _candidates(client: Any, checks: dict[str, ClientRetryCheck]) -> Iterator[tuple[str, Any]]:
    if client is None:
        return
    yield "", client
    members: dict[str, Any] = {}
    if isinstance(client, dict):
        members = {str(name): value for name, value in client.items()}
    elif isinstance(client, tuple | list):
        members = {f"[{index}]": value for index, value in enumerate(client)}
    elif hasattr(client, "__dict__") and type(client).__module__.split(".")[0] not in checks:
        members = {name: value for name, value in vars(client).items() if not name.startswith("_")}
    for name, value in members.items():
        yield f"{name!r}", value


def _httpx_retries(client: Any) -> str | None:
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    for transport in transports:
        count = getattr(getattr(transport, "_pool", None), "_retries", 0)
        if count:
            return f"transport retries={count}"
    return None


def _requests_retries(session: Any) -> str | None:
    for prefix, adapter in getattr(session, "adapters", {}).items():
        retry = getattr(adapter, "max_retries", None)
        total = getattr(retry, "total", 0)
        if total or getattr(retry, "connect", None) or getattr(retry, "read", None):
            return f"max_retries={total!r} for {prefix}"
    return None


def _urllib3_retries(pool_manager: Any) -> str | None:
    if not hasattr(pool_manager, "connection_pool_kw"):
        return None
    retries = pool_manager.connection_pool_kw.get("retries")
    return None if retries in (False, 0) else f"retries={retries!r}"


_LIBRARY_CHECKS = (
    ClientRetryCheck(
        module="httpx",
        retries=_httpx_retries,
        fix="build its transport with retries=0 (the default): httpx.AsyncHTTPTransport()",
    ),
    ClientRetryCheck(
        module="requests", retries=_requests_retries, fix="mount an HTTPAdapter with max_retries=0"
    ),
    ClientRetryCheck(module="urllib3", retries=_urllib3_retries, fix="pass retries=False"),
)
"""The HTTP libraries onceflow knows; a family adds others (``ToolFamily.client_checks``)."""
