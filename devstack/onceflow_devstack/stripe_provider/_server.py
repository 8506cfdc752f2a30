"""Running the provider: in the caller's event loop, in a thread, or as a process.

:func:`running_provider` is for async in-process tests (ephemeral port on 127.0.0.1 by
default); :func:`provider_in_thread` is for synchronous callers; :func:`serve` is what
``onceflow local-stripe`` and ``python -m devstack.stripe_provider`` run, printing only the
base URL.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import AsyncIterator, Collection, Iterator
from concurrent.futures import Future
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass

from aiohttp import web

from ._app import PROVIDER, Provider, ProviderConfig, build_provider_app


@dataclass(frozen=True)
class RunningProvider:
    """A provider serving HTTP.

    Attributes:
        base_url: ``http://host:port``, to pass as the Stripe SDK's ``api`` base address.
        provider: Its live state, for direct in-process inspection.
    """

    base_url: str
    provider: Provider


@asynccontextmanager
async def running_provider(
    config: ProviderConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    shutdown_timeout: float = 1.0,
) -> AsyncIterator[RunningProvider]:
    """Serve the provider in the current event loop for the duration of the block.

    Args:
        config: Provider settings.
        host: Interface to bind. Default ``"127.0.0.1"``.
        port: Port to bind; 0 picks a free one. Default ``0``.
        shutdown_timeout: Seconds to let handlers still sleeping in a delay fault finish
            on exit before they are cancelled. Default ``1.0``.

    Yields:
        The running provider with its actual base URL.
    """
    app = build_provider_app(config)
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield RunningProvider(f"http://{bound_host}:{bound_port}", app[PROVIDER])
    finally:
        await runner.cleanup()


@contextmanager
def provider_in_thread(
    config: ProviderConfig | None = None, *, host: str = "127.0.0.1", port: int = 0
) -> Iterator[RunningProvider]:
    """Serve the provider from its own event loop in a daemon thread.

    For synchronous callers (the SDK's sync methods) that would block an in-loop server.
    Read its state through :class:`ProviderControl` or, between requests, directly.

    Args:
        config: Provider settings.
        host: Interface to bind. Default ``"127.0.0.1"``.
        port: Port to bind; 0 picks a free one. Default ``0``.

    Yields:
        The running provider with its actual base URL.
    """
    loop = asyncio.new_event_loop()
    stopping: asyncio.Future[None] = loop.create_future()
    started: Future[RunningProvider] = Future()

    async def run() -> None:
        try:
            async with running_provider(config, host=host, port=port) as running:
                started.set_result(running)
                await stopping
        except BaseException as error:
            if not started.done():
                started.set_exception(error)
            raise

    thread = threading.Thread(
        target=loop.run_until_complete, args=(run(),), name="stripe-provider", daemon=True
    )
    thread.start()
    try:
        yield started.result(timeout=10)
    finally:
        loop.call_soon_threadsafe(stopping.set_result, None)
        thread.join(timeout=10)
        loop.close()


def serve(
    host: str = "127.0.0.1",
    port: int = 12111,
    key_retention_seconds: float = 86400.0,
    search_lag_seconds: float = 0.0,
    api_keys: Collection[str] | None = None,
) -> None:
    """Run the provider until SIGINT or SIGTERM, printing its base URL first.

    Args:
        host: Interface to bind. Default ``"127.0.0.1"``.
        port: Port to bind; 0 picks a free one. Default ``12111`` (stripe-mock's port).
        key_retention_seconds: Idempotency key retention. Default ``86400.0``.
        search_lag_seconds: Search visibility lag. Default ``0.0``.
        api_keys: Accepted secret keys; None accepts any ``sk_test_...`` key.
    """
    config = ProviderConfig(
        key_retention_seconds=key_retention_seconds,
        search_lag_seconds=search_lag_seconds,
        api_keys=frozenset(api_keys) if api_keys is not None else None,
    )
    with suppress(KeyboardInterrupt):
        asyncio.run(_serve_until_stopped(config, host, port))


async def _serve_until_stopped(config: ProviderConfig, host: str, port: int) -> None:
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError):
            loop.add_signal_handler(signum, stopped.set)
    async with running_provider(config, host=host, port=port) as running:
        # A parent process reads this line to learn the port when it asked for port 0.
        print(running.base_url, flush=True, file=sys.stdout)
        await stopped.wait()
