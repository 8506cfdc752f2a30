"""The failure classification helpers: only a failure before sending is safe to repeat."""

import socket

import aiohttp
import httpx
import psycopg
import pytest

from onceflow.tools import (
    NothingSent,
    OutcomeClass,
    classify_database_error,
    classify_http_error,
    classify_http_status,
)

SUCCEEDED, REJECTED = OutcomeClass.SUCCEEDED, OutcomeClass.REJECTED
TRANSIENT, UNKNOWN = OutcomeClass.TRANSIENT, OutcomeClass.UNKNOWN


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, SUCCEEDED),
        (201, SUCCEEDED),
        (400, REJECTED),
        (404, REJECTED),
        (422, REJECTED),
        (408, TRANSIENT),
        (409, TRANSIENT),
        (429, TRANSIENT),
        (503, TRANSIENT),
        (500, UNKNOWN),
        (502, UNKNOWN),
        (504, UNKNOWN),
        (599, UNKNOWN),
        (302, UNKNOWN),
    ],
)
def test_http_answers_are_classified_by_whether_the_work_may_be_done(
    status: int, outcome: OutcomeClass
) -> None:
    assert classify_http_status(status)[0] is outcome


def test_connection_errors_before_sending_are_transient_and_after_sending_unknown() -> None:
    request = httpx.Request("POST", "http://desk/tickets")
    before = [
        httpx.ConnectError("refused", request=request),
        httpx.ConnectTimeout("slow connect", request=request),
        httpx.PoolTimeout("no connection", request=request),
        ConnectionRefusedError(),
        socket.gaierror("no such host"),
        NothingSent("the record could not be written"),
    ]
    after = [
        httpx.ReadTimeout("no answer", request=request),
        httpx.WriteTimeout("half written", request=request),
        httpx.RemoteProtocolError("dropped", request=request),
        httpx.ReadError("reset", request=request),
        aiohttp.ServerDisconnectedError(),
        TimeoutError(),
        RuntimeError("something we do not know"),
    ]
    assert {classify_http_error(error)[0] for error in before} == {TRANSIENT}
    assert {classify_http_error(error)[0] for error in after} == {UNKNOWN}
    outcome, reason = classify_http_error(after[0])
    assert reason == "no answer after sending (ReadTimeout); the work may be done"


def test_database_errors_keep_a_lost_commit_unknown() -> None:
    assert classify_database_error(psycopg.OperationalError("gone"))[0] is UNKNOWN
    assert classify_database_error(psycopg.errors.UniqueViolation("dup"))[0] is REJECTED
