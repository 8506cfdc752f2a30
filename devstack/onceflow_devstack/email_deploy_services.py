"""The embedded stack's email and deployment far sides, and one outbox relay.

Unless ``SMTP_URL`` points elsewhere, the local SMTP sink runs and the relay delivers to
it; unless ``DEPLOY_TARGET_URL`` does, the local deployment target runs and the worker
writes to it. Their addresses are recorded in the state folder so ``onceflow relay``
and the demo find them while the stack runs.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from onceflow.deployments import DeployTargetSettings
from onceflow.email import EmailSettings, serve_relay
from onceflow_devstack.deploy_target import running_deploy_target
from onceflow_devstack.ports import (
    DEFAULT_PORTS,
    DEPLOY_TARGET_PORT,
    FLAGS,
    SINK_CONTROL_PORT,
    SMTP_PORT,
    PortInUse,
    StackPorts,
)
from onceflow_devstack.smtp_sink import running_smtp_sink

LOCAL_STEP_SECONDS = 0.3
"""Simulated work per deployment step at the local target, so progress is visible."""

T = TypeVar("T")

_SINK_CONTROL_FILE = "smtp_sink_control_url"
_TARGET_URL_FILE = "deploy_target_url"


@dataclass(frozen=True)
class EmailAndDeployEndpoints:
    """Where email goes and where deployments land."""

    smtp_url: str
    smtp_is_local: bool
    smtp_sink_control_url: str | None
    """The local sink's JSON record of what it received; None for an external server."""
    deploy_target: DeployTargetSettings
    deploy_target_is_local: bool

    def describe(self) -> list[tuple[str, str]]:
        """(what, where) pairs for the stack's banner."""
        smtp = (
            f"{self.smtp_url} (local sink; received mail at {self.smtp_sink_control_url}/messages)"
            if self.smtp_is_local
            else f"{self.smtp_url} (SMTP_URL)"
        )
        target = self.deploy_target.url or "not configured"
        return [
            ("SMTP (outbox relay)", smtp),
            (
                "deployment target",
                f"{target} (local)"
                if self.deploy_target_is_local
                else f"{target} (DEPLOY_TARGET_URL)",
            ),
        ]


def running_stack_smtp_sink_control_url(state_dir: Path) -> str | None:
    """The local sink's side door of a running (or last) embedded stack, if any."""
    return _recorded(state_dir / _SINK_CONTROL_FILE)


def running_stack_deploy_target_url(state_dir: Path) -> str | None:
    """The deployment target a running (or last) embedded stack's worker uses, if any."""
    return _recorded(state_dir / _TARGET_URL_FILE)


@asynccontextmanager
async def email_and_deploy_services(
    state_dir: Path,
    *,
    email: EmailSettings,
    deploy_target: DeployTargetSettings,
    database_url: str,
    ports: StackPorts = DEFAULT_PORTS,
    progress: Callable[[str], None] = lambda message: None,
) -> AsyncIterator[EmailAndDeployEndpoints]:
    """Run the sink and target (where ``email`` and ``deploy_target`` name none) and one
    relay; the endpoints name the settings the stack's worker then uses.

    The sink and target listen on ``ports``' ``smtp``, ``smtp_control`` and
    ``deploy_target`` (see ``StackPorts`` for a port left unchosen).
    """
    for name in (_SINK_CONTROL_FILE, _TARGET_URL_FILE):
        (state_dir / name).unlink(missing_ok=True)
    deploy = deploy_target
    stop_relay = asyncio.Event()
    relay: asyncio.Task[None] | None = None
    async with AsyncExitStack() as exits:
        control_url = None
        if email.smtp_url is None:
            progress("starting the local SMTP sink")
            sink = await _on_port_or_any(
                exits,
                lambda port, control_port: running_smtp_sink(port=port, control_port=control_port),
                (ports.smtp, ports.smtp_control),
                (SMTP_PORT, SINK_CONTROL_PORT),
                (FLAGS["smtp"], FLAGS["smtp_control"]),
            )
            email = email.model_copy(update={"smtp_url": sink.smtp_url})
            control_url = sink.control_url
            if control_url:
                (state_dir / _SINK_CONTROL_FILE).write_text(control_url)
        target_is_local = deploy.url is None
        if target_is_local:
            progress("starting the local deployment target")
            target = await _on_port_or_any(
                exits,
                lambda port: running_deploy_target(port=port, step_seconds=LOCAL_STEP_SECONDS),
                (ports.deploy_target,),
                (DEPLOY_TARGET_PORT,),
                (FLAGS["deploy_target"],),
            )
            deploy = deploy.model_copy(update={"url": target.url})
        (state_dir / _TARGET_URL_FILE).write_text(deploy.url or "")
        progress("starting an email outbox relay")
        relay = asyncio.create_task(serve_relay(email, database_url=database_url, stop=stop_relay))
        try:
            yield EmailAndDeployEndpoints(
                smtp_url=email.smtp_server.describe(),
                smtp_is_local=control_url is not None,
                smtp_sink_control_url=control_url,
                deploy_target=deploy,
                deploy_target_is_local=target_is_local,
            )
        finally:
            stop_relay.set()
            with contextlib.suppress(Exception):
                await relay


async def _on_port_or_any(
    exits: AsyncExitStack,
    start: Callable[..., contextlib.AbstractAsyncContextManager[T]],
    chosen: tuple[int | None, ...],
    defaults: tuple[int, ...],
    flags: tuple[str, ...],
) -> T:
    """Start a service on its ports: a chosen one exactly (refusing when it is taken), one
    left unchosen on its default, or on any free port when that is taken."""
    wanted = tuple(
        default if port is None else port for port, default in zip(chosen, defaults, strict=True)
    )
    anywhere = tuple(0 if port is None else port for port in chosen)
    failure: OSError | None = None
    for ports in dict.fromkeys((wanted, anywhere)):  # once when every port was chosen
        try:
            return await exits.enter_async_context(start(*ports))
        except OSError as taken:  # a default taken, e.g. by another stack's service
            failure = taken
    given = [f"{port} ({flag})" for port, flag in zip(chosen, flags, strict=True) if port]
    if not given:
        assert failure is not None
        raise failure
    raise PortInUse(
        f"port {' or '.join(given)} is already in use by another program; stop it or choose "
        "other ports (--port-base N, or the flag)"
    )


def _recorded(path: Path) -> str | None:
    return (path.read_text().strip() or None) if path.exists() else None
