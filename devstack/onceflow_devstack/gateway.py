"""The gateway inside the embedded stack, with a dev principal the demo and agents can use.

The dev principal (tenant ``dev``, name ``dev-agent``, every tool, may decide) gets an API
key the first time; the key is kept in ``<state_dir>/dev_api_key`` (mode 0600) and reused
while it still authenticates, so scripts can read it from there.
"""

import errno
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.gateway import (
    ALL_TOOLS,
    GatewaySettings,
    PrincipalStore,
    Unauthenticated,
    load_gateway_settings,
    open_boundary,
)
from onceflow.settings import OnceflowSettings, ProcessSettings
from onceflow.storage import build_pool
from onceflow_devstack.ports import FLAGS, GATEWAY_PORT, PortInUse

DEV_TENANT = "dev"
DEV_PRINCIPAL = "dev-agent"
DEV_API_KEY_FILE = "dev_api_key"


@dataclass(frozen=True)
class DevGateway:
    """The embedded gateway and the dev principal's key."""

    url: str
    api_key: str = field(repr=False)
    api_key_file: Path


def running_stack_gateway(state_dir: Path) -> tuple[str, str] | None:
    """(gateway URL, dev API key) of a running (or last) embedded stack, if recorded."""
    url_file, key_file = state_dir / "gateway_url", state_dir / DEV_API_KEY_FILE
    if not (url_file.exists() and key_file.exists()):
        return None
    return url_file.read_text().strip(), key_file.read_text().strip()


@asynccontextmanager
async def running_gateway(
    settings: OnceflowSettings,
    *,
    state_dir: Path,
    database_url: str,
    temporal_address: str,
    port: int | None,
    gateway_settings: GatewaySettings | None = None,
    encryption: PayloadEncryptionSettings | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> AsyncIterator[DevGateway]:
    """Serve the HTTP API on ``127.0.0.1:port``, or with ``port`` None on ``GATEWAY_PORT``
    (another free port if that is taken). With payload keys in ``encryption`` its client
    encrypts and it serves the codec endpoint at ``/codec`` for the Web UI.

    Raises:
        PortInUse: ``port`` is taken.
    """
    # Imported here so that every other command does not load the web stack.
    from onceflow.gateway.http_api import build_app
    from onceflow.gateway.http_server import HttpServer
    from onceflow.tools.worker import load_configured_tools

    logging.getLogger("onceflow.gateway").setLevel(logging.INFO)
    progress("starting the gateway")
    api_key = await _dev_api_key(database_url, state_dir / DEV_API_KEY_FILE)
    configured = gateway_settings or load_gateway_settings()
    # Before build_app: it documents a route per tool.
    load_configured_tools(settings.tools, ProcessSettings())
    # Opened before the server, as `onceflow gateway` does, so a failure to open it is the
    # stack's start-up failure rather than a traceback uvicorn logs.
    async with open_boundary(
        settings,
        configured,
        database_url=database_url,
        temporal_address=temporal_address,
        encryption=encryption,
    ) as service:
        server = HttpServer(
            build_app(lambda: nullcontext(service), encryption=encryption),
            host="127.0.0.1",
            port=GATEWAY_PORT if port is None else port,
            handle_signals=False,
            any_port_if_taken=port is None,
        )
        try:
            url = await server.start()
        except OSError as taken:
            if taken.errno != errno.EADDRINUSE:
                raise
            raise PortInUse(
                f"port {GATEWAY_PORT if port is None else port} ({FLAGS['gateway']}) is already "
                "in use by another program; "
                "stop it or choose other ports (--port-base N, or the flag)"
            ) from None
        (state_dir / "gateway_url").write_text(url)
        try:
            yield DevGateway(url=url, api_key=api_key, api_key_file=state_dir / DEV_API_KEY_FILE)
        finally:
            await server.stop()


async def _dev_api_key(database_url: str, key_file: Path) -> str:
    async with build_pool(database_url, max_size=1) as pool:
        principals = PrincipalStore(pool)
        if key_file.exists():
            try:
                await principals.authenticate(key_file.read_text().strip())
                return key_file.read_text().strip()
            except Unauthenticated:
                pass  # a new database: issue a new key below
        principal = await principals.find(tenant=DEV_TENANT, name=DEV_PRINCIPAL)
        if principal is None:
            _, api_key = await principals.create(
                tenant=DEV_TENANT, name=DEV_PRINCIPAL, tools=[ALL_TOOLS], may_decide=True
            )
        else:
            api_key = await principals.issue_key(principal)
    key_file.touch(mode=0o600, exist_ok=True)
    key_file.chmod(0o600)
    key_file.write_text(api_key)
    return api_key
