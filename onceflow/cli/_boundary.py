"""The boundary's commands: ``onceflow gateway``, ``onceflow mcp``, ``onceflow principal``.

Registered on the main app by ``register``, so ``cli/main.py`` only wires them in.
"""

import asyncio
import errno
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, nullcontext
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from onceflow.cli._failures import CommandFailed, ExitCode
from onceflow.cli._services import reach_database, register_configured_tools, settings_and_database
from onceflow.cli.plugin import stop_on_signals

if TYPE_CHECKING:
    from onceflow.gateway import Principal

T = TypeVar("T")
Operate = Callable[[Callable[[], Awaitable[Any]]], Any]

API_KEY_VARIABLE = "ONCEFLOW_API_KEY"

_errors = Console(stderr=True)

Host = Annotated[str, typer.Option(help="Interface to listen on.")]
TemporalAddress = Annotated[
    str | None,
    typer.Option(help="Temporal frontend host:port (default: TEMPORAL_ADDRESS or localhost:7233)."),
]


class McpTransport(StrEnum):
    """How ``onceflow mcp`` talks to its client."""

    STDIO = "stdio"
    HTTP = "http"


def register(app: typer.Typer, operate: Operate) -> None:
    """Add the boundary's commands to ``app``; ``operate`` runs their async bodies."""

    @app.command()
    def gateway(
        host: Host = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 8080,
        temporal_address: TemporalAddress = None,
    ) -> None:
        """Serve the HTTP API (OpenAPI at /openapi.json) until SIGTERM/SIGINT."""
        settings, database_url = settings_and_database()
        gateway_settings = _gateway_settings()
        encryption = _configuration().payload_encryption
        # Before build_app: it documents a route per tool.
        register_configured_tools(_configuration())

        async def body() -> None:
            from onceflow.gateway import open_boundary
            from onceflow.gateway.http_api import build_app
            from onceflow.telemetry import process_telemetry

            stop, ready = asyncio.Event(), asyncio.Event()
            stop_on_signals(stop, ready=ready)  # uvicorn's own handlers take over once it serves
            await reach_database(database_url)
            # Opened here rather than in the app's lifespan: a dependency that is down stops
            # the command with one line and its exit code, not uvicorn's traceback.
            async with (
                process_telemetry("onceflow-gateway"),
                open_boundary(
                    settings,
                    gateway_settings,
                    database_url=database_url,
                    temporal_address=temporal_address,
                    encryption=encryption,
                ) as service,
            ):
                # With payload keys, also the codec endpoint at /codec (the Temporal UI's).
                app = build_app(lambda: nullcontext(service), encryption=encryption)
                async with _serving(app, host, port) as url:
                    ready.set()
                    print(f"onceflow gateway ready on {url} (pid {os.getpid()})", flush=True)
            print("onceflow gateway stopped", flush=True)

        operate(body)

    @app.command()
    def mcp(
        transport: Annotated[
            McpTransport,
            typer.Option(
                help="stdio (one client, key from ONCEFLOW_API_KEY) "
                "or http (streamable HTTP at /mcp, Bearer per request)."
            ),
        ] = McpTransport.STDIO,
        host: Host = "127.0.0.1",
        port: Annotated[int, typer.Option(help="Port for --transport http.")] = 8090,
        temporal_address: TemporalAddress = None,
    ) -> None:
        """Serve every catalogue tool over MCP, through the same boundary as the HTTP API.

        Each MCP session is one open task: its first tool call opens it, its end (stdio
        input closed, the HTTP session deleted or idle, the server stopping) closes it.
        Without a session (MCP 2026-07-28 over HTTP) each call is a task of its own,
        identified by its idempotency_key; a call that waits can be a durable MCP task.
        """
        settings, database_url = settings_and_database()
        gateway_settings = _gateway_settings()
        encryption = _configuration().payload_encryption
        register_configured_tools(_configuration())  # the MCP tools are the catalogue's
        api_key = os.environ.get(API_KEY_VARIABLE)
        if transport is McpTransport.STDIO and not api_key:
            raise CommandFailed(
                f"{API_KEY_VARIABLE} must hold the API key the stdio MCP server acts as "
                "(create one with `onceflow principal add`)",
                exit_code=ExitCode.BAD_INPUT,
            )

        async def body() -> None:
            from mcp.server.stdio import stdio_server

            from onceflow.gateway import open_boundary
            from onceflow.gateway.mcp_server import (
                bearer_principal,
                build_mcp_server,
                fixed_principal,
            )
            from onceflow.telemetry import process_telemetry

            await reach_database(database_url)
            # The key before Temporal: a refused key is one line whatever else is down.
            principal = (
                await _authenticated(database_url, api_key)
                if transport is McpTransport.STDIO and api_key
                else None
            )
            async with (
                process_telemetry("onceflow-mcp"),
                open_boundary(
                    settings,
                    gateway_settings,
                    database_url=database_url,
                    temporal_address=temporal_address,
                    encryption=encryption,
                ) as service,
            ):
                if transport is McpTransport.STDIO:
                    assert principal is not None  # checked before the body runs
                    server = build_mcp_server(service, fixed_principal(principal))
                    _errors.print(
                        f"onceflow MCP server on stdio as {principal.tenant}/{principal.name}"
                    )
                    async with stdio_server() as (read_stream, write_stream):
                        await server.run(
                            read_stream, write_stream, server.create_initialization_options()
                        )
                    return
                server = build_mcp_server(service, bearer_principal(service))
                app = server.streamable_http_app(host=host)
                async with _serving(app, host, port) as url:
                    print(f"onceflow MCP server ready on {url}/mcp (pid {os.getpid()})", flush=True)

        operate(body)

    principal = typer.Typer(
        help="Principals (agents, scripts, operators) and their API keys.", no_args_is_help=True
    )

    @principal.command("add")
    def principal_add(
        tenant: Annotated[str, typer.Option(help="Tenant the principal acts for.")],
        name: Annotated[str, typer.Option(help="Principal name, unique in the tenant.")],
        tools: Annotated[
            str,
            typer.Option(
                help="Comma-separated tools it may call, or '*' for all (none for a "
                "principal that only decides)."
            ),
        ] = "",
        decisions: Annotated[
            bool, typer.Option(help="May approve and reconcile tasks (operators only).")
        ] = False,
        approvals: Annotated[
            bool,
            typer.Option(
                help="May approve or deny its tenant's steps awaiting approval, but not "
                "reconcile parked ones (an app's approval screen)."
            ),
        ] = False,
        key_quota: Annotated[
            int | None, typer.Option(min=1, help="New idempotency keys per quota window.")
        ] = None,
    ) -> None:
        """Create a principal and print its API key (shown this once, stored hashed)."""
        from onceflow.tools.worker import CATALOGUE

        settings, database_url = settings_and_database()
        register_configured_tools(_configuration())
        allowed = [tool.strip() for tool in tools.split(",") if tool.strip()]
        unknown = [tool for tool in allowed if tool != "*" and tool not in CATALOGUE]
        if unknown or not (allowed or decisions or approvals):
            known = ", ".join(contract.name for contract in CATALOGUE)
            raise CommandFailed(
                f"unknown tool(s) {', '.join(unknown) or '(none given)'}; known: {known}",
                exit_code=ExitCode.BAD_INPUT,
            )

        async def body() -> None:
            from onceflow.gateway import PrincipalExists, PrincipalStore
            from onceflow.storage import build_pool

            async with build_pool(database_url, max_size=1) as pool:
                try:
                    added, api_key = await PrincipalStore(pool).create(
                        tenant=tenant,
                        name=name,
                        tools=allowed,
                        may_decide=decisions,
                        may_approve=approvals,
                        key_quota=key_quota,
                    )
                except (PrincipalExists, ValueError) as refused:
                    raise CommandFailed(str(refused), exit_code=ExitCode.BAD_INPUT) from None
            calls = f"may call {', '.join(allowed)}" if allowed else "calls no tool"
            _errors.print(
                f"principal {tenant}/{name} {calls}; decides: {_decides(added)}; "
                "its API key (shown once):"
            )
            print(api_key, flush=True)

        operate(body)

    @principal.command("list")
    def principal_list(
        tenant: Annotated[str | None, typer.Option(help="Only this tenant's principals.")] = None,
    ) -> None:
        """List the principals: their tools and the decisions they may make."""
        _, database_url = settings_and_database()

        async def body() -> None:
            from rich.table import Table

            from onceflow.gateway import PrincipalStore
            from onceflow.storage import build_pool

            async with build_pool(database_url, max_size=1) as pool:
                found = await PrincipalStore(pool).principals(tenant=tenant)
            table = Table("tenant", "name", "tools", "decides", "key quota")
            for listed in found:
                table.add_row(
                    listed.tenant,
                    listed.name,
                    ", ".join(sorted(listed.allowed_tools)) or "-",
                    _decides(listed),
                    str(listed.key_quota) if listed.key_quota is not None else "default",
                )
            # Wide enough for the names even when piped (rich assumes 80 columns then).
            Console(width=max(Console().width, 120)).print(table)

        operate(body)

    app.add_typer(principal, name="principal")


def _decides(principal: "Principal") -> str:
    if principal.may_decide:
        return "approvals and reconciliations"
    return "approvals" if principal.may_approve else "nothing"


def _configuration() -> Any:
    from onceflow.cli._configuration import loaded_configuration

    return loaded_configuration()


def _gateway_settings() -> Any:
    # Checked with every other section, the retention against the retry window included.
    return _configuration().gateway


async def _authenticated(database_url: str, api_key: str) -> "Principal":
    """The principal ``api_key`` belongs to, or one line saying the key is refused."""
    from onceflow.gateway import PrincipalStore, Unauthenticated
    from onceflow.storage import build_pool

    async with build_pool(database_url, max_size=1) as pool:
        try:
            return await PrincipalStore(pool).authenticate(api_key)
        except Unauthenticated as refused:
            raise CommandFailed(
                f"{refused.detail}; fix: set {API_KEY_VARIABLE} to a key `onceflow principal "
                "add` printed for this database (a revoked key no longer works)",
                exit_code=ExitCode.CREDENTIALS_REFUSED,
            ) from None


@asynccontextmanager
async def _serving(app: Any, host: str, port: int) -> AsyncIterator[str]:
    """Serve ``app``; the block runs once it listens, then the server runs until a signal.

    Uvicorn handles SIGTERM/SIGINT itself: it stops accepting, finishes in-flight
    requests and runs the app's shutdown (closing the pool and clients) before exiting.
    """
    from onceflow.gateway.http_server import HttpServer

    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    server = HttpServer(app, host=host, port=port)
    try:
        url = await server.start()
    except OSError as taken:
        if taken.errno != errno.EADDRINUSE:
            raise
        raise CommandFailed(
            f"port {port} on {host} is already in use; fix: stop what listens there, or "
            "choose another with --port"
        ) from None
    yield url
    await server.wait()
