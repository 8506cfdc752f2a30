"""Readiness apart from liveness, ``Retry-After`` on every 503, and a task start that
cannot reach Temporal releasing its claim.

The gateway's PostgreSQL and Temporal are each behind a proxy the test cuts
(``outages.TcpProxy``): the address then refuses connections, as a server that went down.
Each test reads the records table and the far side (orders), not only the answers.
"""

import time
from typing import Any

import httpx
import psycopg
import pytest
from psycopg_pool import PoolTimeout
from temporalio.service import RPCError, RPCStatusCode

from onceflow.gateway.http_api import build_app

from .conftest import Caller, Stack, count, open_service, rows
from .outages import fragile_boundary, served

ORDER = {
    "customer_id": "c-ready",
    "currency": "eur",
    "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
}
NOT_READY = "urn:onceflow:problem:not-ready"
UNAVAILABLE = "urn:onceflow:problem:backend-unavailable"


def retry_after(response: httpx.Response) -> int:
    """The answer's ``Retry-After`` in seconds; fails when there is none."""
    assert "Retry-After" in response.headers, (response.status_code, response.headers)
    seconds = int(response.headers["Retry-After"])
    assert seconds >= 1
    return seconds


@pytest.mark.parametrize("down", ["temporal", "database"])
async def test_readyz_names_the_backend_that_is_down_and_healthz_stays_ok(
    stack: Stack, agent: Caller, http: httpx.AsyncClient, database: str, down: str
) -> None:
    async with (
        # The backend taken down refuses at once; the one that stays up must answer within
        # the timeout on a loaded machine too (0.5 s did not, once, for Temporal).
        fragile_boundary(stack, readiness_timeout_seconds=5) as fragile,
        served(fragile.service) as url,
    ):
        ready = await http.get(f"{url}/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json() == {"status": "ready", "checks": {"database": "ok", "temporal": "ok"}}

        await getattr(fragile, down).stop()
        started = time.monotonic()
        not_ready = await http.get(f"{url}/readyz")
        took = time.monotonic() - started
        alive = await http.get(f"{url}/healthz")

        # Every other 503 this outage causes carries Retry-After too.
        if down == "temporal":
            # The claim and the start are the first to meet it.
            refused = await http.post(
                f"{url}/v1/tools/create_order/calls",
                json=ORDER,
                headers={**agent.headers, "Idempotency-Key": "order-ready-1"},
            )
            status = await http.get(f"{url}/v1/tasks/no-such-task", headers=agent.headers)
            outage = [refused, status]
        else:
            outage = [await http.get(f"{url}/v1/tools", headers=agent.headers)]

    assert not_ready.status_code == 503, not_ready.text
    assert not_ready.headers["content-type"].startswith("application/problem+json")
    retry_after(not_ready)
    problem = not_ready.json()
    assert problem["type"] == NOT_READY
    up = "database" if down == "temporal" else "temporal"
    assert problem["checks"] == {down: "unreachable", up: "ok"}
    assert {"temporal": "Temporal", "database": "PostgreSQL"}[down] in problem["detail"]
    # Six times its own 5 s timeout: a probe that hangs on a backend fails, a loaded core
    # does not.
    assert took < 30, "readiness waits its own timeout, it does not hang on the backend"
    assert alive.status_code == 200 and alive.json() == {"status": "ok"}
    for response in outage:
        assert response.status_code == 503, response.text
        assert response.json()["type"] == UNAVAILABLE
        retry_after(response)
    assert count(database, "idempotency_records") == 0
    assert count(database, "orders") == 0


async def test_a_start_that_cannot_reach_temporal_releases_the_claim_for_the_next_retry(
    stack: Stack, agent: Caller, http: httpx.AsyncClient, database: str
) -> None:
    headers = {**agent.headers, "Idempotency-Key": "order-outage-1"}
    async with fragile_boundary(stack) as fragile, served(fragile.service) as down:
        await fragile.temporal.stop()
        refused = await http.post(
            f"{down}/v1/tools/create_order/calls", json=ORDER, headers=headers
        )

    assert refused.status_code == 503, refused.text
    assert refused.json()["type"] == UNAVAILABLE
    retry_after(refused)
    # The claim went with the failed start: nothing holds the key now.
    assert rows(database, "SELECT state FROM idempotency_records") == []
    assert count(database, "orders") == 0

    async with served(open_service(stack)) as up:
        retry = await http.post(f"{up}/v1/tools/create_order/calls", json=ORDER, headers=headers)
        again = await http.post(f"{up}/v1/tools/create_order/calls", json=ORDER, headers=headers)

    assert retry.status_code == 200, retry.text
    assert retry.json()["state"] == "succeeded"
    assert "Idempotent-Replayed" not in retry.headers, "the retry started the task itself"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == retry.content
    # Token 1: the retry made a fresh claim, it did not wait out a 30 s lease and take it over.
    assert rows(database, "SELECT state, fencing_token FROM idempotency_records") == [
        ("succeeded", 1)
    ]
    assert count(database, "orders") == 1
    assert await stack.task_workflows(agent.principal.tenant) == 1


def _never_opened() -> Any:
    raise AssertionError("the service is set on the app directly")


class _FailingService:
    """A service whose every backend call fails with ``error`` untranslated."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def authenticate(self, api_key: str | None) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        PoolTimeout("couldn't get a connection after 10.00 sec"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""),
    ],
    ids=["pool-timeout", "connection-lost", "temporal-unavailable"],
)
async def test_an_outage_the_service_did_not_translate_is_still_a_503_with_retry_after(
    error: Exception,
) -> None:
    app = build_app(_never_opened)
    # The app's lifespan does not run under the ASGI transport: the service is set here.
    app.state.service = _FailingService(error)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        answer = await http.get("/v1/tools", headers={"Authorization": "Bearer ofk_x"})

    assert answer.status_code == 503, answer.text
    assert answer.json()["type"] == UNAVAILABLE
    retry_after(answer)
    assert str(error) not in answer.text
