"""Serves an ASGI app (the HTTP API or the MCP server) with uvicorn inside an event loop."""

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn

LISTEN_BACKLOG = 2048
"""uvicorn's own default backlog."""


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling, for hosts that stop it themselves."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """One uvicorn server: ``start`` returns once it listens, ``stop`` drains it.

    Args:
        app: The ASGI app; its lifespan runs before the server listens.
        host: Interface to bind.
        port: Port to bind; 0 picks a free one.
        handle_signals: Let uvicorn stop on SIGTERM/SIGINT (a command's own server); off
            when the host process owns the signals (the embedded stack).
        any_port_if_taken: Bind a free port when ``port`` is in use instead of failing.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str,
        port: int,
        handle_signals: bool = True,
        any_port_if_taken: bool = False,
    ) -> None:
        config = uvicorn.Config(app, host=host, port=port, access_log=False, log_level="warning")
        self._server = uvicorn.Server(config) if handle_signals else _Server(config)
        self._host = host
        self._port = port
        self._any_port_if_taken = any_port_if_taken
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Bind, run the app's start-up and listen; returns the base URL."""
        sock = self._bind()
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                sock.close()
                try:
                    self._task.result()
                except SystemExit:  # uvicorn's way of reporting a failed start-up
                    pass
                raise RuntimeError("the HTTP server stopped during start-up (see its log)")
            await asyncio.sleep(0.02)
        return f"http://{self._host}:{sock.getsockname()[1]}"

    async def wait(self) -> None:
        """Until the server has stopped (by a signal, or ``stop``)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, run the app's shutdown."""
        self._server.should_exit = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def _bind(self) -> socket.socket:
        """A socket bound and listening on the port (or, if allowed, any port when it is
        taken). With SO_REUSEADDR two processes may both bind a port neither listens on
        yet; the port is only theirs once listening, so both steps count as taking it."""
        try:
            return self._listen_on(self._port)
        except OSError:
            if not self._any_port_if_taken:
                raise
            return self._listen_on(0)

    def _listen_on(self, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Accepted connections inherit it; without it every small response waits for
            # the peer's delayed ACK (about 40 ms), as uvicorn's own listeners would not.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.bind((self._host, port))
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(True)
        return sock
