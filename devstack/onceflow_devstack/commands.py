"""The dev stack's commands, added to ``onceflow`` through the ``onceflow.cli`` entry point:
``onceflow dev``, ``onceflow demo`` and ``onceflow local-stripe``."""

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from onceflow.cli.plugin import CommandFailed, console, errors, operate, stop_on_signals
from onceflow.telemetry import process_telemetry
from onceflow_devstack.binaries import MissingBinary
from onceflow_devstack.ports import PortInUse, StackPorts

T = TypeVar("T")

TemporalPort = Annotated[int, typer.Option(help="Temporal gRPC port.")]
UiPort = Annotated[int, typer.Option(help="Temporal Web UI port.")]
_PORTS = "Ports"


def _port(text: str) -> object:
    return typer.Option(min=0, max=65535, help=text, rich_help_panel=_PORTS, show_default=False)


def register(app: typer.Typer) -> None:
    """Add ``dev``, ``demo`` and ``local-stripe`` to ``app``."""
    app.command("dev")(dev)
    app.command("demo")(demo)
    app.command("local-stripe")(provider)


def dev(
    port_base: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535 - 6,
            rich_help_panel=_PORTS,
            help="Take seven consecutive ports from N: Temporal N, its Web UI N+1, the gateway "
            "N+2, the Stripe-compatible provider N+3, SMTP N+4, the SMTP sink's side door "
            "N+5, the deployment target N+6. Default: Temporal 7233 and 8233; the others "
            "8080, 12111, 2525, 12113, 12112 or any free port when those are taken.",
        ),
    ] = None,
    temporal_port: Annotated[int | None, _port("Temporal gRPC port (overrides the base).")] = None,
    ui_port: Annotated[int | None, _port("Temporal Web UI port.")] = None,
    gateway_port: Annotated[int | None, _port("The gateway's HTTP API port.")] = None,
    provider_port: Annotated[int | None, _port("The Stripe-compatible provider's port.")] = None,
    smtp_port: Annotated[int | None, _port("The SMTP sink's port.")] = None,
    smtp_control_port: Annotated[int | None, _port("The SMTP sink's JSON side door.")] = None,
    deploy_target_port: Annotated[int | None, _port("The deployment target's port.")] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="The stack's data, logs and dev.env (default: ONCEFLOW_STATE_DIR or "
            "./.onceflow). One stack per folder: run a second stack with its own folder and "
            "ports.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the embedded stack in the foreground until Ctrl-C: PostgreSQL, Temporal, a worker,
    the gateway and the local far sides.

    Another shell joins it with `source <state dir>/dev.env`. A second stack on the same
    state folder is refused (exit 1), as is a port another program holds.
    """
    from onceflow.cli import loaded_configuration
    from onceflow_devstack.stack import embedded_stack

    ports = _chosen_ports(
        port_base,
        temporal=temporal_port,
        ui=ui_port,
        gateway=gateway_port,
        provider=provider_port,
        smtp=smtp_port,
        smtp_control=smtp_control_port,
        deploy_target=deploy_target_port,
    )
    configuration = loaded_configuration()
    if state_dir is not None:
        settings = configuration.onceflow.model_copy(update={"state_dir": state_dir})
        configuration = configuration.model_copy(update={"onceflow": settings})

    async def body() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        stop_on_signals(stop, ready=ready)
        async with (
            process_telemetry("onceflow-dev"),
            embedded_stack(
                configuration,
                ports=ports,
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


def _chosen_ports(base: int | None, **flags: int | None) -> StackPorts:
    """The base's ports (or the defaults), each flag given overriding its own."""
    ports = StackPorts.from_base(base) if base is not None else StackPorts()
    return dataclasses.replace(
        ports, **{name: port for name, port in flags.items() if port is not None}
    )


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
    from onceflow.cli import loaded_configuration
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
        # Imported here, as the stack itself is: loading it takes a quarter of a second
        # that every other command (``onceflow tasks`` included) would pay at start-up.
        from onceflow_devstack.stack import StackAlreadyRunning

        try:
            return await body()
        except (StackAlreadyRunning, PortInUse, MissingBinary) as failure:
            raise CommandFailed(str(failure)) from None

    return phrased
