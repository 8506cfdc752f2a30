"""HTTP headers fuzzed byte by byte against a live gateway process.

``Authorization``, ``Idempotency-Key``, ``Content-Type`` and ``Content-Length`` get
oversize, malformed, mistyped and adversarial values (control characters, non-ASCII
bytes, lies about the body's length) on a request written straight to the socket, since
HTTP clients refuse to send most of them. Whatever arrives: no 5xx, a refusal writes
nothing, and no answer echoes the raw key or API key.
"""

import asyncio
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from tests.harness import HANG_SECONDS

from .conftest import Caller, GatewayProcess, rows

COUPON = b'{"user_id": "u-fuzz", "coupon_id": "WELCOME10"}'
HEADER_BYTES = st.one_of(
    st.binary(max_size=64),
    st.binary(min_size=1000, max_size=20_000),
    st.text(max_size=80).map(lambda text: text.encode("utf-8")),
    st.sampled_from(
        [
            b"",
            b" ",
            b"\x00",
            b"\xff\xfe",
            b"a\rb",
            b"a\nX-Injected: 1",
            b"x" * 70_000,
            "ключ".encode(),
        ]
    ),
)


def mostly(
    valid: bytes, fuzzed: st.SearchStrategy[bytes | None]
) -> st.SearchStrategy[bytes | None]:
    """The valid value two draws in three, so a fuzzed header meets otherwise valid ones
    (a request with every header broken is refused by whichever check runs first)."""
    return st.one_of(st.just(valid), st.just(valid), fuzzed)


def authorization(api_key: str) -> st.SearchStrategy[bytes | None]:
    valid = b"Bearer " + api_key.encode()
    return mostly(
        valid,
        st.one_of(
            st.none(),
            HEADER_BYTES.map(lambda value: b"Bearer " + value),
            st.sampled_from(
                [b"Bearer", b"Bearer ", b"bearer " + api_key.encode(), b"Basic dXNlcjpwYXNz"]
            ),
            HEADER_BYTES,
        ),
    )


KEYS = st.one_of(
    st.from_regex(rb"\A[A-Za-z0-9][A-Za-z0-9._:-]{11,40}\Z"),
    st.from_regex(rb"\A[A-Za-z0-9][A-Za-z0-9._:-]{11,40}\Z"),
    st.none(),
    HEADER_BYTES,
    st.just(b"k" * 201),
)
CONTENT_TYPES = mostly(
    b"application/json",
    st.one_of(
        st.none(),
        st.sampled_from(
            [
                b"application/json",
                b"application/json; charset=utf-8",
                b"application/json; charset=latin-1",
                b"text/plain",
                b"application/x-www-form-urlencoded",
                b"multipart/form-data; boundary=x",
                b"application/problem+json",
                b"*/*",
            ]
        ),
        HEADER_BYTES,
    ),
)
CONTENT_LENGTHS = st.one_of(
    st.just("exact"),
    st.just("exact"),
    st.just("exact"),
    st.sampled_from([b"0", b"-1", b"abc", b"1e3", b"99999999999999999999", b"262145", b" 5"]),
    st.integers(min_value=0, max_value=len(COUPON) - 1).map(lambda n: str(n).encode()),
    st.just(b"5, 5"),
)


def exchange(url: str, header_lines: list[bytes], body: bytes) -> bytes:
    """Write one request to the socket; returns what came back before the server closed
    the connection or went quiet (a lie about the length may leave it waiting)."""
    parts = urlsplit(url)
    request = (
        b"POST /v1/tools/issue_coupon/calls HTTP/1.1\r\nHost: "
        + parts.netloc.encode()
        + b"\r\n"
        + b"".join(line + b"\r\n" for line in header_lines)
        + b"Connection: close\r\n\r\n"
        + body
    )
    received = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=HANG_SECONDS) as conn:
        conn.sendall(request)
        try:
            while chunk := conn.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return received


def written(database: str) -> tuple[Any, ...]:
    return rows(
        database,
        "SELECT (SELECT count(*) FROM idempotency_records),"
        " (SELECT count(*) FROM coupon_issuances)",
    )[0]


@pytest.mark.timeout(600)
@settings(
    max_examples=120,
    deadline=None,
    phases=[Phase.generate],
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
async def test_fuzzed_headers_get_no_5xx_and_refusals_write_nothing(
    gateways: tuple[GatewayProcess, GatewayProcess],
    agent: Caller,
    database: str,
    data: st.DataObject,
) -> None:
    auth = data.draw(authorization(agent.api_key), label="authorization")
    key = data.draw(KEYS, label="idempotency key")
    content_type = data.draw(CONTENT_TYPES, label="content type")
    length = data.draw(CONTENT_LENGTHS, label="content length")
    lines = [
        *([b"Authorization: " + auth] if auth is not None else []),
        *([b"Idempotency-Key: " + key] if key is not None else []),
        *([b"Content-Type: " + content_type] if content_type is not None else []),
        b"Content-Length: " + (str(len(COUPON)).encode() if length == "exact" else length),
    ]
    before = written(database)

    received = await asyncio.to_thread(exchange, gateways[0].url, lines, COUPON)

    status_line = received.split(b"\r\n", 1)[0]
    if not received:
        event("no answer")
        # The server hung up or still waits for the body it was promised: nothing ran.
        assert written(database) == before
        return
    status = int(status_line.split()[1])
    event(f"status {status}")
    assert status < 500, received[:600]
    if status >= 400:
        assert written(database) == before, f"a {status} wrote something"
    if key is not None and len(key) >= 12 and status >= 400:
        assert key not in received, "an answer echoed the raw key"
    assert agent.api_key.encode() not in received, "an answer echoed the API key"
