"""The dev stack's commands, added to ``onceflow`` through the ``onceflow.cli`` entry point:
``onceflow dev``, ``onceflow demo`` and ``onceflow provider``."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer

from onceflow.cli.plugin import CommandFailed, console, errors, operate, stop_on_signals
from onceflow.telemetry import process_telemetry
from onceflow_devstack.binaries import MissingBinary
from onceflow_devstack.stack import StackAlreadyRunning
from onceflow_devstack.temporal import PortInUse

T = TypeVar("T")

TemporalPort = Annotated[int, typer.Option(help="Temporal gRPC port.")]
UiPort = Annotated[int, typer.Option(help="Temporal Web UI port.")]


def register(app: typer.Typer) -> None:
    """Add ``dev``, ``demo`` and ``provider`` to ``app``."""
    app.command("dev")(dev)
    app.command("demo")(demo)
    app.command("provider")(provider)


def dev(temporal_port: TemporalPort = 7233, ui_port: UiPort = 8233) -> None:
    """Run the embedded stack in the foreground until Ctrl-C: PostgreSQL, Temporal, a worker."""
    from onceflow.cli._configuration import loaded_configuration
    from onceflow_devstack.stack import embedded_stack

    async def body() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        stop_on_signals(stop, ready=ready)
        async with (
            process_telemetry("onceflow-dev"),
            embedded_stack(
                loaded_configuration(),
                temporal_port=temporal_port,
                ui_port=ui_port,
                progress=lambda message: errors.print(f"[dim]… {message}[/]"),
            ) as stack,
        ):
            ready.set()
            console.print("[bold green]onceflow dev stack is running[/]")
            for what, where in stack.describe():
                console.print(f"  {what:<26} {where}", highlight=False, soft_wrap=True)
            console.print("Press Ctrl-C to stop.")
            await stop.wait()
        console.print("stopped cleanly")

    operate(_phrased(body))


def demo(
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    agent: Annotated[
        bool,
        typer.Option(
            "--agent",
            help="Run the PydanticAI support agent example (examples/support_agent) instead.",
        ),
    ] = False,
) -> None:
    """Run a short scripted agent task end to end on the embedded stack and explain it."""
    from onceflow.cli._configuration import loaded_configuration
    from onceflow_devstack.demo import run_agent_demo, run_demo

    run = run_agent_demo if agent else run_demo
    operate(_phrased(lambda: run(loaded_configuration(), console, temporal_port, ui_port)))


def provider(
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind; 0 picks a free one.")] = 12111,
    key_retention_seconds: Annotated[
        float, typer.Option(help="How long an idempotency key is honoured (Stripe: ~24 h).")
    ] = 86400.0,
    search_lag_seconds: Annotated[
        float, typer.Option(help="Delay before a new object appears in search results.")
    ] = 0.0,
) -> None:
    """Run the local Stripe-compatible provider (prints its URL for STRIPE_API_BASE)."""
    from onceflow_devstack.stripe_provider import serve

    serve(
        host=host,
        port=port,
        key_retention_seconds=key_retention_seconds,
        search_lag_seconds=search_lag_seconds,
    )


def _phrased(body: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
    """``body`` with the stack's own failures phrased for the operator."""

    async def phrased() -> T:
        try:
            return await body()
        except (StackAlreadyRunning, PortInUse, MissingBinary) as failure:
            raise CommandFailed(str(failure)) from None

    return phrased
