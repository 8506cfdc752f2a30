"""What every ``onceflow`` command (and a distribution adding commands) runs on.

``operate`` runs a command's async body and turns any failure into one line and an exit
code (``ExitCode``); ``stop_on_signals`` makes SIGINT/SIGTERM stop a long-running command
cleanly. The embedded dev stack (``onceflow-devstack``) adds ``dev``, ``demo`` and
``local-stripe`` through the ``onceflow.cli`` entry point group: each entry is a
``register(app)`` function.
"""

import asyncio
import signal
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from onceflow.cli._failures import CommandFailed, ExitCode, explain

__all__ = [
    "ENTRY_POINT_GROUP",
    "CommandFailed",
    "ExitCode",
    "console",
    "errors",
    "operate",
    "print_failure",
    "register_plugin_commands",
    "stop_on_signals",
]

ENTRY_POINT_GROUP = "onceflow.cli"
"""Entry point group of distributions that add commands: ``register(app: typer.Typer)``."""
DEV_STACK_COMMANDS = ("dev", "demo", "local-stripe")
"""The commands ``onceflow-devstack`` adds."""

console = Console()
errors = Console(stderr=True)
T = TypeVar("T")


def operate(action: Callable[[], Awaitable[T]]) -> T:
    """Run one command's async body, turning any failure into one line and an exit code."""
    try:
        return _run_to_completion(action())
    except typer.Exit:
        raise
    except asyncio.CancelledError:
        errors.print("stopped before it was ready")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    except Exception as error:  # the one place every failure is phrased for the operator
        failure = explain(error)
        print_failure(failure)
        raise typer.Exit(failure.exit_code) from None


def print_failure(failure: CommandFailed) -> None:
    """One ``error:`` line per problem; escaped, as settings problems name [tables]."""
    for line in str(failure).splitlines() or [""]:
        errors.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)


def _run_to_completion(main: Awaitable[T]) -> T:
    """Like ``asyncio.run``, but leftovers get a bounded time to end after ``main`` does.

    A client still polling a server that has gone away may never finish cancelling;
    ``asyncio.run`` would wait for it forever and Ctrl-C would never return the prompt.
    """
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main)
    finally:
        leftovers = asyncio.all_tasks(loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            loop.run_until_complete(asyncio.wait(leftovers, timeout=10))
        loop.close()


def stop_on_signals(stop: asyncio.Event, *, ready: asyncio.Event | None = None) -> None:
    """SIGINT/SIGTERM set ``stop``; before ``ready`` is set they abort start-up instead."""
    loop = asyncio.get_running_loop()
    starting = asyncio.current_task()

    def on_signal() -> None:
        if ready is not None and not ready.is_set() and starting is not None:
            starting.cancel()  # leaves each started service's cleanup to run
        stop.set()

    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(stop_signal, on_signal)


def register_plugin_commands(app: typer.Typer) -> None:
    """Add the commands of installed distributions (the dev stack's), or, when the dev
    stack is not installed, stand-ins for its commands that say how to get it."""
    for point in entry_points(group=ENTRY_POINT_GROUP):
        register: Callable[[typer.Typer], None] = point.load()
        register(app)
    present = {
        command.name or getattr(command.callback, "__name__", "")
        for command in app.registered_commands
    }
    for name in DEV_STACK_COMMANDS:
        if name not in present:
            app.command(name, help="Needs the embedded dev stack (onceflow-devstack).")(
                _needs_dev_stack(name)
            )


def _needs_dev_stack(name: str) -> Callable[[], None]:
    def missing() -> None:
        print_failure(
            CommandFailed(
                f"`onceflow {name}` comes with the embedded dev stack, which is not installed; "
                "fix: pip install onceflow-devstack (from this repository: "
                "pip install ./devstack, or `make dev`)"
            )
        )
        raise typer.Exit(ExitCode.BAD_INPUT)

    return missing
