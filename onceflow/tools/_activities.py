"""Turns a registered tool into Temporal activities the workflow calls by the tool's name.

The wrapper validates the arguments, hands the implementation a ``ToolCall``, and makes
sure every attempt ends as one classified ``ToolAttemptResult``: an exception becomes
``unknown`` (the effect may have happened), ``NothingSent`` becomes ``transient``, and
``KeyWindowClosed`` (nothing sent past the key's send-by deadline) becomes ``transient``
with ``KeyUnusable.SEND_BY_PASSED``, which the workflow answers with a look-up and a park,
and ``DatabaseUnavailable`` becomes ``transient`` marked ``database_unavailable``, which
the workflow retries without charging the attempt caps.
"""

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError
from temporalio import activity

from onceflow.errors import describe_validation
from onceflow.retry_policy import OutcomeClass
from onceflow.tools._attempts import KeyUnusable, ToolAttemptResult, ToolCallInput
from onceflow.tools._call import ToolCall
from onceflow.tools._classify import DatabaseUnavailable, KeyWindowClosed, NothingSent
from onceflow.tools._tool import Implementation, Tool, lookup_activity_name

_log = logging.getLogger(__name__)


def tool_activities(tool: Tool, pool: AsyncConnectionPool, client: Any) -> list[Callable[..., Any]]:
    """The activities of ``tool`` (perform, and its lookup if any) bound to its client."""

    @activity.defn(name=tool.name)
    async def perform(identity: ToolCallInput) -> ToolAttemptResult:
        return await _run(tool, tool.perform, identity, pool, client)

    activities: list[Callable[..., Any]] = [perform]
    look_up = tool.look_up
    if look_up is not None:

        @activity.defn(name=lookup_activity_name(tool.name))
        async def run_look_up(identity: ToolCallInput) -> ToolAttemptResult:
            return await _run(tool, look_up, identity, pool, client)

        activities.append(run_look_up)
    return activities


async def _run(
    tool: Tool,
    implementation: Implementation,
    identity: ToolCallInput,
    pool: AsyncConnectionPool,
    client: Any,
) -> ToolAttemptResult:
    contract = tool.registered_contract
    try:
        args = contract.input_model.model_validate(identity.arguments)
    except ValidationError as invalid:
        return ToolAttemptResult(
            outcome=OutcomeClass.REJECTED,
            reason=f"invalid arguments: {describe_validation(invalid, whole='arguments')}",
        )
    call = ToolCall(args=args, identity=identity, client=client, contract=contract, pool=pool)
    try:
        result = await implementation(call)
    except KeyWindowClosed as closed:
        return ToolAttemptResult(
            outcome=OutcomeClass.TRANSIENT,
            reason=str(closed),
            evidence=closed.evidence,
            key_unusable=KeyUnusable.SEND_BY_PASSED,
        )
    except DatabaseUnavailable as unavailable:
        return ToolAttemptResult(
            outcome=OutcomeClass.TRANSIENT, reason=str(unavailable), database_unavailable=True
        )
    except NothingSent as not_sent:
        return ToolAttemptResult(outcome=OutcomeClass.TRANSIENT, reason=str(not_sent))
    except asyncio.CancelledError:
        raise
    except Exception as error:
        # The message may quote a request body or a secret: log and report the type only.
        _log.warning(
            "%s raised %s in step %s of %s; outcome unknown",
            tool.name,
            type(error).__name__,
            identity.step_id,
            identity.workflow_id,
        )
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"{tool.name} raised {type(error).__name__}; the effect may have happened",
        )
    if not isinstance(result, ToolAttemptResult):
        return ToolAttemptResult(
            outcome=OutcomeClass.UNKNOWN,
            reason=f"{tool.name} returned a {type(result).__name__}, not a ToolAttemptResult",
        )
    return _judge_miss(result, identity)


def _judge_miss(result: ToolAttemptResult, identity: ToolCallInput) -> ToolAttemptResult:
    """An eventual look-up's miss proves absence once its lag has passed since the step's
    last attempt ended. Judged here, so the answer is recorded in history (the workflow
    acts on ``miss_proves_absence`` alone and replays the same), by the server's clock
    the workflow's times come from: the time the look-up was scheduled, no later than
    its read."""
    lag = result.miss_proves_absence_after
    if lag is None or result.miss_proves_absence or result.outcome is OutcomeClass.SUCCEEDED:
        return result
    if not miss_past_lag(identity.last_attempt_ended_at, lag):
        return result
    return result.model_copy(update={"miss_proves_absence": True})


def miss_past_lag(last_attempt_ended_at: datetime | None, lag: timedelta) -> bool:
    """Whether a look-up running now reads an eventual index ``lag`` after the step's
    last attempt ended (never, with no attempt named). Call it in a look-up activity."""
    if last_attempt_ended_at is None:
        return False
    return activity.info().current_attempt_scheduled_time >= last_attempt_ended_at + lag
