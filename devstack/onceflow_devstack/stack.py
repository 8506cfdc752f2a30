"""The embedded stack behind ``onceflow dev`` and ``onceflow demo``.

PostgreSQL (or ``DATABASE_URL``), schema migrations, the Temporal dev server with the
Web UI, the local Stripe-compatible provider (unless ``STRIPE_API_BASE`` or
``STRIPE_API_KEY`` point the worker at a real one), and one worker, all under one state
folder, on the ports of ``StackPorts``. A lock file in the state folder, held for the
stack's life, makes a second concurrent stack on that folder refuse clearly (stacks on
other folders and ports run side by side); the operating system releases it when a stack
dies, so a crashed run never blocks the next.
"""

import asyncio
import fcntl
import os
import shlex
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import SecretStr
from temporalio.client import Client

from onceflow.configuration import OnceflowConfiguration
from onceflow.deployments import DeployTargetSettings
from onceflow.email import EmailSettings
from onceflow.encryption import PayloadEncryptionSettings
from onceflow.nexus import DEFAULT_ENDPOINT, ensure_nexus_endpoint
from onceflow.payments import StripeSettings
from onceflow.storage import apply_migrations
from onceflow.worker import serve_worker
from onceflow_devstack.email_deploy_services import (
    EmailAndDeployEndpoints,
    email_and_deploy_services,
)
from onceflow_devstack.gateway import DEV_PRINCIPAL, DEV_TENANT, running_gateway
from onceflow_devstack.ports import (
    DEFAULT_PORTS,
    FLAGS,
    GATEWAY_PORT,
    PROVIDER_PORT,
    PortInUse,
    StackPorts,
    port_is_taken,
)
from onceflow_devstack.postgres import EmbeddedPostgres
from onceflow_devstack.stripe_provider import running_provider
from onceflow_devstack.temporal import TemporalDevServer


class StackAlreadyRunning(RuntimeError):
    """Another embedded stack holds this state folder."""


@dataclass(frozen=True)
class StackInfo:
    """What runs where."""

    state_dir: Path
    database_url: str
    database_is_embedded: bool
    temporal_address: str
    ui_url: str
    task_queue: str
    payment_provider_url: str | None = None
    """Where the worker's Stripe client points."""
    payment_provider_is_local: bool = False
    """Whether that is the local Stripe-compatible provider run by the stack."""
    gateway_url: str | None = None
    """The boundary's HTTP API (OpenAPI at ``/docs``)."""
    dev_api_key_file: Path | None = None
    """Where the dev principal's API key is kept (tenant ``dev``, every tool)."""
    email_and_deploy: EmailAndDeployEndpoints | None = None
    """The SMTP server the stack's relay delivers to and the deployment target."""
    join_file: Path | None = None
    """Shell exports that point other commands (``onceflow worker``, ``relay``, ``gateway``)
    at this stack; production commands never find a dev stack by themselves."""
    codec_endpoint: str | None = None
    """The gateway's codec endpoint the Web UI decodes payloads through, when they are
    encrypted (``ONCEFLOW_PAYLOAD_KEYS``)."""
    nexus_endpoint: str | None = None
    """The Nexus endpoint routing ``OnceflowTools`` calls to the worker (docs/nexus.md)."""
    nexus_principal: str | None = None
    """The principal the worker's Nexus service acts as (``nexus_principal``)."""

    def describe(self) -> list[tuple[str, str]]:
        """(what, where) pairs for printing."""
        database = (
            "embedded PostgreSQL" if self.database_is_embedded else "PostgreSQL (DATABASE_URL)"
        )
        return [
            ("Temporal (gRPC)", self.temporal_address),
            ("Temporal Web UI", self.ui_url),
            (database, _without_password(self.database_url)),
            ("worker task queue", self.task_queue),
            (
                "Stripe-compatible provider" if self.payment_provider_is_local else "Stripe",
                f"{self.payment_provider_url} (local, in-process)"
                if self.payment_provider_is_local
                else self.payment_provider_url or "not configured (STRIPE_API_KEY unset)",
            ),
            ("gateway (HTTP API)", f"{self.gateway_url} (OpenAPI at {self.gateway_url}/docs)"),
            ("dev API key", f"{self.dev_api_key_file} (principal dev/dev-agent)"),
            *(
                [
                    (
                        "codec endpoint (payloads encrypted)",
                        f"{self.codec_endpoint} (sign in at "
                        f"{self.codec_endpoint}/login with the dev API key)",
                    )
                ]
                if self.codec_endpoint
                else []
            ),
            *(
                [("Nexus endpoint", f"{self.nexus_endpoint} (as principal {self.nexus_principal})")]
                if self.nexus_endpoint
                else []
            ),
            *(self.email_and_deploy.describe() if self.email_and_deploy else []),
            ("state and logs", str(self.state_dir)),
            *([("join from another shell", f"source {self.join_file}")] if self.join_file else []),
        ]


def running_stack_database_url(state_dir: Path) -> str | None:
    """The database URL a running (or last) embedded stack recorded, if any."""
    recorded = state_dir / "database_url"
    return recorded.read_text().strip() if recorded.exists() else None


LOCAL_PROVIDER_KEY = "sk_test_onceflow_local"
"""The secret key the embedded worker uses at the local provider (it accepts any sk_test_)."""


def running_stack_provider_url(state_dir: Path) -> str | None:
    """The local provider URL a running (or last) embedded stack recorded, if any."""
    recorded = state_dir / "stripe_provider_url"
    return recorded.read_text().strip() if recorded.exists() else None


def running_stack_temporal(state_dir: Path) -> tuple[str, str] | None:
    """(Temporal address, Web UI URL) a running (or last) embedded stack recorded, if any."""
    recorded = state_dir / "temporal_endpoints"
    if not recorded.exists():
        return None
    address, _, ui_url = recorded.read_text().strip().partition(" ")
    return address, ui_url


@asynccontextmanager
async def embedded_stack(
    configuration: OnceflowConfiguration,
    *,
    ports: StackPorts = DEFAULT_PORTS,
    progress: Callable[[str], None] = lambda message: None,
) -> AsyncIterator[StackInfo]:
    """Run the whole stack for the duration of the block, then stop it in order.

    The stack lives in ``configuration``'s state folder and listens on ``ports``. Its
    worker serves the built-in tools of ``configuration`` with its Stripe, SMTP and
    deployment target settings pointed at the local far sides wherever ``configuration``
    names none.

    Raises:
        StackAlreadyRunning: Another stack holds the state folder.
        PortInUse: A port it was given is taken.
    """
    settings = configuration.onceflow
    state_dir = settings.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(state_dir / "dev.lock"):
        ports.refuse_taken()
        postgres: EmbeddedPostgres | None = None
        encryption, codec_endpoint, gateway_port = _codec_endpoint(configuration, ports)
        temporal = TemporalDevServer(
            state_dir, port=ports.temporal, ui_port=ports.ui, codec_endpoint=codec_endpoint
        )
        stop_worker = asyncio.Event()
        worker_task: asyncio.Task[None] | None = None
        local_provider = AsyncExitStack()
        gateway = AsyncExitStack()
        far_sides = AsyncExitStack()
        try:
            if settings.database_url:
                database_url = settings.database_url
            else:
                progress("starting PostgreSQL")
                postgres = EmbeddedPostgres(state_dir / "postgres")
                database_url = postgres.url
            (state_dir / "database_url").write_text(database_url)
            progress("applying migrations")
            await apply_migrations(database_url)
            progress("starting the Temporal dev server")
            endpoints = await temporal.start()
            (state_dir / "temporal_endpoints").write_text(f"{endpoints.address} {endpoints.ui_url}")
            progress(f"creating the Nexus endpoint {DEFAULT_ENDPOINT}")
            await ensure_nexus_endpoint(
                await Client.connect(endpoints.address),
                name=DEFAULT_ENDPOINT,
                task_queue=settings.task_queue,
            )
            # Nexus callers act as the dev principal (the gateway creates it) unless the
            # settings name another.
            worker_settings = settings.model_copy(
                update={
                    "nexus_principal": settings.nexus_principal or f"{DEV_TENANT}/{DEV_PRINCIPAL}"
                }
            )
            stripe, provider_is_local = await _stripe_for_worker(
                configuration.read(StripeSettings),
                state_dir,
                local_provider,
                ports.provider,
                progress,
            )
            email_and_deploy = await far_sides.enter_async_context(
                email_and_deploy_services(
                    state_dir,
                    email=configuration.read(EmailSettings),
                    deploy_target=configuration.read(DeployTargetSettings),
                    database_url=database_url,
                    ports=ports,
                    progress=progress,
                )
            )
            progress("starting a worker")
            ready = asyncio.Event()
            worker_task = asyncio.create_task(
                serve_worker(
                    configuration.with_sections(
                        stripe, email_and_deploy.deploy_target, worker_settings
                    ),
                    database_url=database_url,
                    stop=stop_worker,
                    temporal_address=endpoints.address,
                    on_ready=ready.set,
                )
            )
            await _wait_until_ready(ready, worker_task)
            boundary = await gateway.enter_async_context(
                running_gateway(
                    settings,
                    state_dir=state_dir,
                    database_url=database_url,
                    temporal_address=endpoints.address,
                    port=gateway_port,
                    encryption=encryption,
                    progress=progress,
                )
            )
            join_file = _write_join_file(
                state_dir,
                {
                    "ONCEFLOW_STATE_DIR": str(state_dir),
                    "DATABASE_URL": database_url,
                    "TEMPORAL_ADDRESS": endpoints.address,
                    "ONCEFLOW_TASK_QUEUE": settings.task_queue,
                    "STRIPE_API_KEY": stripe.api_key.get_secret_value() if stripe.api_key else None,
                    "STRIPE_API_BASE": stripe.api_base,
                    "SMTP_URL": email_and_deploy.smtp_url,
                    "DEPLOY_TARGET_URL": email_and_deploy.deploy_target.url,
                    "ONCEFLOW_GATEWAY_URL": boundary.url,
                    **_encryption_exports(encryption),
                },
                notes={
                    "Temporal Web UI": endpoints.ui_url,
                    "SMTP sink's received mail": (
                        f"{email_and_deploy.smtp_sink_control_url}/messages"
                        if email_and_deploy.smtp_sink_control_url
                        else None
                    ),
                    "dev API key (principal dev/dev-agent)": str(boundary.api_key_file),
                },
            )
            yield StackInfo(
                state_dir=state_dir,
                database_url=database_url,
                database_is_embedded=postgres is not None,
                temporal_address=endpoints.address,
                ui_url=endpoints.ui_url,
                task_queue=settings.task_queue,
                payment_provider_url=stripe.api_base
                or ("https://api.stripe.com" if stripe.configured else None),
                payment_provider_is_local=provider_is_local,
                gateway_url=boundary.url,
                dev_api_key_file=boundary.api_key_file,
                email_and_deploy=email_and_deploy,
                join_file=join_file,
                codec_endpoint=codec_endpoint,
                nexus_endpoint=DEFAULT_ENDPOINT,
                nexus_principal=worker_settings.nexus_principal,
            )
        finally:
            progress("stopping")
            await gateway.aclose()
            stop_worker.set()
            if worker_task is not None:
                # Draining is bounded: a worker whose server vanished may never finish.
                drained, _ = await asyncio.wait(
                    {worker_task}, timeout=settings.shutdown_grace_seconds + 15
                )
                if not drained:
                    progress("the worker did not drain in time; stopping anyway")
                    worker_task.cancel()
            await far_sides.aclose()
            await local_provider.aclose()
            temporal.stop()
            if postgres is not None:
                postgres.stop()


def _codec_endpoint(
    configuration: OnceflowConfiguration, ports: StackPorts
) -> tuple[PayloadEncryptionSettings, str | None, int | None]:
    """The encryption settings of the stack's gateway, the codec endpoint the Web UI is
    started with (None without payload keys) and the gateway's port.

    With keys, the gateway's port is settled before the dev server starts, since the UI
    is told the endpoint's address then; the endpoint is named on ``localhost`` like the
    UI, so the sign-in cookie stays same-site; and unless ``ONCEFLOW_UI_ORIGIN`` says
    otherwise, the one origin it answers is this stack's UI.
    """
    encryption = configuration.payload_encryption
    if not encryption.enabled:
        return encryption, None, ports.gateway
    port = ports.gateway
    if port is None:
        port = GATEWAY_PORT if not port_is_taken(GATEWAY_PORT) else _free_port()
    if "ui_origin" not in encryption.model_fields_set:
        encryption = encryption.model_copy(update={"ui_origin": f"http://localhost:{ports.ui}"})
    return encryption, f"http://localhost:{port}/codec", port


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _encryption_exports(encryption: PayloadEncryptionSettings) -> dict[str, str | None]:
    """The payload keys, for commands that join the stack (they read its tasks)."""
    if not encryption.enabled:
        return {}
    return {
        "ONCEFLOW_PAYLOAD_KEYS": ",".join(
            entry.get_secret_value() for entry in encryption.payload_keys
        ),
        "ONCEFLOW_PAYLOAD_KEY_ID": encryption.payload_key_id,
        "ONCEFLOW_UI_ORIGIN": encryption.ui_origin,
    }


async def _stripe_for_worker(
    stripe: StripeSettings,
    state_dir: Path,
    exits: AsyncExitStack,
    port: int | None,
    progress: Callable[[str], None],
) -> tuple[StripeSettings, bool]:
    """The worker's Stripe settings: the configured ones, else the local provider's (on
    ``port``, or as ``StackPorts`` says when it is None)."""
    recorded = state_dir / "stripe_provider_url"
    recorded.unlink(missing_ok=True)
    if stripe.api_base or stripe.configured:
        return stripe, False
    progress("starting the local Stripe-compatible provider")
    try:
        running = await exits.enter_async_context(
            running_provider(port=PROVIDER_PORT if port is None else port)
        )
    except OSError:
        if port is not None:  # taken since the stack checked it at start
            raise PortInUse(
                f"port {port} ({FLAGS['provider']}) is already in use by another program; "
                "stop it or choose other ports (--port-base N, or the flag)"
            ) from None
        # e.g. a standalone `onceflow local-stripe` holds the default port
        running = await exits.enter_async_context(running_provider(port=0))
    recorded.write_text(running.base_url)
    local = stripe.model_copy(
        update={"api_key": SecretStr(LOCAL_PROVIDER_KEY), "api_base": running.base_url}
    )
    return local, True


async def _wait_until_ready(ready: asyncio.Event, worker_task: "asyncio.Task[None]") -> None:
    ready_wait = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({ready_wait, worker_task}, return_when=asyncio.FIRST_COMPLETED)
    if worker_task in done:
        ready_wait.cancel()
        worker_task.result()  # re-raises why the worker could not start
        raise RuntimeError("the worker stopped before it was ready")


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path``; refuse at once when another process holds it."""
    with path.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise StackAlreadyRunning(
                f"an embedded stack is already running from {path.parent} (pid {holder}); "
                "use it, or stop it with Ctrl-C in its terminal"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_join_file(
    state_dir: Path, settings: dict[str, str | None], *, notes: dict[str, str | None]
) -> Path:
    """``dev.env``: one ``export NAME=value`` per setting, then the stack's other addresses
    as comments (no setting reads them); readable by its owner only."""
    path = state_dir / "dev.env"
    lines = [
        "# Written by `onceflow dev`: `source` it to point onceflow commands at this stack.\n",
        *(
            f"export {name}={shlex.quote(value)}\n"
            for name, value in settings.items()
            if value is not None
        ),
        *(f"# {what}: {where}\n" for what, where in notes.items() if where is not None),
    ]
    path.touch(mode=0o600)
    path.write_text("".join(lines))
    return path


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url
