"""A load generator that costs next to nothing per request: raw HTTP/1.1 over keep-alive
connections, each request encoded once before the clock starts.

A benchmark of a boundary's answer against ``GET /healthz`` measures the server only while
its load generator is the cheaper side. httpx is not: its connection pool scans every
connection for each request it places (``has_expired``, a socket poll each), and a POST
with headers and a body costs it twice a bare GET, on the same two cores the gateway uses.
Here each of ``concurrency`` senders owns one connection and writes pre-encoded bytes; a
response is read by its ``Content-Length`` (uvicorn always sends one for these answers).
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class RawResponse:
    status_code: int
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its last value."""
    body: bytes


Checker = Callable[[RawResponse], None]
"""What a benchmark asserts of each answer (raises when it is not the one expected)."""


def encode_request(
    method: str, url: str, path: str, headers: dict[str, str], body: bytes = b""
) -> bytes:
    """One HTTP/1.1 request, as sent, for ``url``'s host."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {urlsplit(url).netloc}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body or method not in ("GET", "HEAD"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send(self, request: bytes) -> RawResponse:
        self._writer.write(request)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head[:-4].decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise RuntimeError(f"a response without Content-Length: {status_line!r}")
        body = await self._reader.readexactly(int(headers["content-length"]))
        return RawResponse(int(status_line.split(" ", 2)[1]), headers, body)

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()


async def send_all(
    url: str,
    request: bytes,
    *,
    requests: int,
    concurrency: int,
    check: Checker,
) -> list[float]:
    """Send ``request`` ``requests`` times from ``concurrency`` senders, each on a new
    keep-alive connection of its own; ``check`` each answer. Returns the latencies (s)."""
    parts = urlsplit(url)
    connections = [
        _Connection(*await asyncio.open_connection(parts.hostname, parts.port))
        for _ in range(concurrency)
    ]
    latencies: list[float] = []
    left = requests

    async def sender(connection: _Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            response = await connection.send(request)
            latencies.append(time.perf_counter() - started)
            check(response)

    try:
        await asyncio.gather(*(sender(connection) for connection in connections))
    finally:
        await asyncio.gather(*(connection.close() for connection in connections))
    return latencies
