"""What the boundary says when Temporal or PostgreSQL does not answer."""

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager

import psycopg
from psycopg_pool import PoolTimeout
from temporalio.service import RPCError, RPCStatusCode

from onceflow.errors import BackendUnavailable, TaskBusy

log = logging.getLogger("onceflow.gateway")

STATUS_QUERY_TIMEOUT = 12.0
"""Seconds a status query may take: longer than the workers' sticky timeout
(``onceflow.worker.STICKY_TIMEOUT``, 10 s), after which another worker answers for one that
crashed; a task whose workers are all down never answers."""
TEMPORAL_UNREACHABLE = (
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
)
"""Temporal's answers that mean it could not be reached (or would not take the call now)."""
UPDATES_IN_FLIGHT = "concurrent in-flight updates"
"""In Temporal's RESOURCE_EXHAUSTED answer when a workflow holds ten Updates in flight."""


@asynccontextmanager
async def backend_errors() -> AsyncIterator[None]:
    """Turn an unreachable Temporal or PostgreSQL into ``BackendUnavailable``.

    A claim already made is kept unless its owner released it (a task start that did not
    reach Temporal, a call or a decision that got no answer): only a retry with the same
    key (which takes the claim over after its lease) may go on with it.
    """
    try:
        yield
    except PoolTimeout:
        raise BackendUnavailable("the database is busy; retry with the same key") from None
    except psycopg.OperationalError:
        raise BackendUnavailable("the database is unreachable; retry with the same key") from None
    except RPCError as error:
        if error.status is RPCStatusCode.RESOURCE_EXHAUSTED and UPDATES_IN_FLIGHT in str(error):
            raise TaskBusy(
                "the task is taking as many calls and decisions at once as Temporal allows "
                "(10 in flight); retry with the same key after Retry-After"
            ) from None
        if error.status in TEMPORAL_UNREACHABLE:
            raise BackendUnavailable(
                "the task service is unreachable; retry with the same key"
            ) from None
        raise


async def answers_within(backend: str, probe: Awaitable[object], timeout: float) -> bool:
    """Whether ``probe`` completed within ``timeout`` seconds."""
    try:
        await asyncio.wait_for(probe, timeout)
    except Exception as error:
        # The type only, as everywhere in the gateway's logs.
        log.warning("readiness: %s did not answer (%s)", backend, type(error).__name__)
        return False
    return True
