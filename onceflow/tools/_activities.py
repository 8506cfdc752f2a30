"""Turns a registered tool into Temporal activities the workflow calls by the tool's name.

The wrapper validates the arguments, hands the implementation a ``ToolCall``, and makes
sure every attempt ends as one classified ``ToolAttemptResult``: an exception becomes
``unknown`` (the effect may have happened), ``NothingSent`` becomes ``transient``, and
``KeyWindowClosed`` (nothing sent past the key's send-by deadline) becomes ``transient``
with ``KeyUnusable.SEND_BY_PASSED``, which the workflow answers with a look-up and a park,
and ``DatabaseUnavailable`` becomes ``transient`` marked ``database_unavailable``, which
the workflow retries without charging the attempt caps.

Before an attempt sends anything, it takes its step's business intent (``IntentIdentity``,
kept in PostgreSQL by ``_intent_claims``): an intent another step holds is answered with
that step's effect once it is known, retried shortly while that step is sending, and
refused, naming that step, while its effect is in doubt. After the attempt, the record
learns its outcome; a look-up that finds the effect records it too.
"""

import asyncio
import functools
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from opentelemetry import metrics
from psycopg_pool import AsyncConnectionPool
from pydantic import ValidationError
from temporalio import activity

from onceflow.errors import describe_validation
from onceflow.retry_policy import OutcomeClass
from onceflow.tools._attempts import KeyUnusable, ProviderHold, ToolAttemptResult, ToolCallInput
from onceflow.tools._call import ToolCall
from onceflow.tools._child_operation import is_unreachable
from onceflow.tools._classify import DatabaseUnavailable, KeyWindowClosed, NothingSent
from onceflow.tools._intent import IntentState, intent_digest, state_after
from onceflow.tools._intent_claims import (
    IntentHolder,
    IntentKey,
    claim_intent,
    record_deliberate_repeat,
    settle_intent,
)
from onceflow.tools._provider import Answer, Provider
from onceflow.tools._provider_budgets import ask_to_send, tell_answer
from onceflow.tools._tool import Implementation, Tool, lookup_activity_name

_log = logging.getLogger(__name__)


@functools.cache
def _held() -> metrics.Counter:
    """Made at first use: asking for a meter at import reads the environment."""
    return metrics.get_meter("onceflow").create_counter(
        "onceflow_provider_sends_held",
        description="Attempts not sent because their provider's fleet-wide budget held them.",
    )


def tool_activities(
    tool: Tool, pool: AsyncConnectionPool, client: Any, *, provider_budgets: bool = True
) -> list[Callable[..., Any]]:
    """The activities of ``tool`` (perform, and its lookup if any) bound to its client.
    ``provider_budgets``: its sends draw on its provider's fleet-wide budget
    (``OnceflowSettings.provider_budgets``)."""
    provider = tool.registered_contract.budget_provider if provider_budgets else None

    @activity.defn(name=tool.name)
    async def perform(identity: ToolCallInput) -> ToolAttemptResult:
        if provider is None:
            result = await _run(tool, tool.perform, identity, pool, client, sends=True)
            return result.model_copy(update={"throttled_for": None})
        return await _send_within_budget(tool, provider, identity, pool, client)

    activities: list[Callable[..., Any]] = [perform]
    look_up = tool.look_up
    if look_up is not None:

        @activity.defn(name=lookup_activity_name(tool.name))
        async def run_look_up(identity: ToolCallInput) -> ToolAttemptResult:
            return await _run(tool, look_up, identity, pool, client, sends=False)

        activities.append(run_look_up)
    return activities


async def _run(
    tool: Tool,
    implementation: Implementation,
    identity: ToolCallInput,
    pool: AsyncConnectionPool,
    client: Any,
    *,
    sends: bool,
) -> ToolAttemptResult:
    """One attempt (``sends``) or look-up, ended as one classified result."""
    contract = tool.registered_contract
    try:
        args = contract.input_model.model_validate(identity.arguments)
    except ValidationError as invalid:
        return ToolAttemptResult(
            outcome=OutcomeClass.REJECTED,
            reason=f"invalid arguments: {describe_validation(invalid, whole='arguments')}",
        )
    intent = _intent_key(tool, args, identity)
    if intent is not None and sends:
        try:
            held = await _take_intent(pool, intent, identity, tool)
        except Exception as error:
            return _nothing_sent(error)
        if held is not None:
            return _answered_by(held, tool.name)
    call = ToolCall(args=args, identity=identity, client=client, contract=contract, pool=pool)
    result = await _attempt(tool, implementation, call, identity)
    if intent is not None and (sends or result.outcome is OutcomeClass.SUCCEEDED):
        await _settle(pool, intent, result)
    return result


async def _send_within_budget(
    tool: Tool, provider: Provider, identity: ToolCallInput, pool: AsyncConnectionPool, client: Any
) -> ToolAttemptResult:
    """An attempt the provider's budget admits, and its answer told to the budget; or,
    when the budget holds it, a result saying so (nothing sent)."""
    try:
        asked = await ask_to_send(pool, provider, identity.send)
    except Exception as error:
        return _nothing_sent(error, "could not read the provider's budget")
    admission = asked.admission
    if not admission.admitted:
        _held().add(1, {"provider": provider.name, "health": admission.health.value})
        return ToolAttemptResult(
            outcome=OutcomeClass.TRANSIENT,
            reason=f"nothing sent: {admission.reason}",
            provider_hold=ProviderHold(
                provider=provider.name,
                health=admission.health,
                recheck_in=admission.recheck_in,
                reason=admission.reason,
            ),
        )
    result = await _run(tool, tool.perform, identity, pool, client, sends=True)
    try:
        await tell_answer(
            pool,
            provider,
            identity.send,
            _answer(result),
            asked.row,
            throttled_for=result.throttled_for or timedelta(0),
        )
    except Exception as error:
        # The budget missed one answer: later answers, and time, correct it.
        _log.warning(
            "could not record %s's answer in its budget (%s)", provider.name, type(error).__name__
        )
    return result


def _answer(result: ToolAttemptResult) -> Answer:
    """How the provider answered, as its budget hears it."""
    if result.database_unavailable or result.key_unusable is KeyUnusable.SEND_BY_PASSED:
        return Answer.NOT_SENT
    if "repeat_of_task" in result.evidence:
        return Answer.NOT_SENT  # answered by the step holding the intent
    if result.throttled_for is not None:
        return Answer.THROTTLED
    if result.outcome in (OutcomeClass.SUCCEEDED, OutcomeClass.REJECTED):
        return Answer.ANSWERED
    return Answer.FAILED


def _intent_key(tool: Tool, args: Any, identity: ToolCallInput) -> IntentKey | None:
    rule = tool.registered_contract.intent
    if rule is None or tool.registered_contract.effects.read_only:
        return None
    return IntentKey(
        tenant=identity.tenant,
        tool=tool.name,
        digest=intent_digest(tool.name, rule, args, workflow_id=identity.workflow_id),
        workflow_id=identity.workflow_id,
        step_id=identity.step_id,
    )


async def _take_intent(
    pool: AsyncConnectionPool, intent: IntentKey, identity: ToolCallInput, tool: Tool
) -> IntentHolder | None:
    """Take the step's intent; the step that holds it instead, if another does. A
    deliberate repeat takes nothing and is recorded."""
    rule = tool.registered_contract.intent
    assert rule is not None
    async with pool.connection() as conn:
        if identity.deliberate_repeat and tool.registered_contract.deliberate_repeats:
            await record_deliberate_repeat(conn, intent)
            return None
        return await claim_intent(conn, intent, rule.window)


def _answered_by(held: IntentHolder, tool: str) -> ToolAttemptResult:
    """The answer to a call whose intent another step holds: nothing was sent."""
    evidence = {"repeat_of_task": held.workflow_id, "repeat_of_step": held.step_id}
    repeat_of = {"task_id": held.workflow_id, "step_id": held.step_id}
    if held.state is IntentState.SUCCEEDED:
        return ToolAttemptResult(
            outcome=OutcomeClass.SUCCEEDED,
            resource_id=held.resource_id,
            result={**held.result, "repeat_of": repeat_of},
            evidence=evidence,
        )
    where = f"task {held.workflow_id}, step {held.step_id}"
    if held.state is IntentState.RUNNING:
        # Most likely ends within a retry: this call then answers with its effect.
        return ToolAttemptResult(
            outcome=OutcomeClass.TRANSIENT,
            reason=f"nothing sent: the same {tool} intent is being made by {where}",
            evidence=evidence,
        )
    return ToolAttemptResult(
        outcome=OutcomeClass.REJECTED,
        reason=(
            f"nothing sent: the same {tool} intent is held by {where}, whose effect may "
            "have happened (it retries, or waits for a person to reconcile it); that "
            "call's outcome answers this one. To make a second effect on purpose, call "
            "again with deliberate_repeat"
        ),
        evidence=evidence,
    )


async def _settle(pool: AsyncConnectionPool, intent: IntentKey, result: ToolAttemptResult) -> None:
    """Record the outcome in the intent's record. If that fails the record still says
    ``running``: other calls of the intent wait or are refused, never sent."""
    try:
        async with pool.connection() as conn:
            await settle_intent(
                conn,
                intent,
                state_after(result.outcome),
                resource_id=result.resource_id,
                result=result.result if result.outcome is OutcomeClass.SUCCEEDED else None,
            )
    except Exception as error:
        _log.warning(
            "could not record the outcome of step %s of %s in its intent (%s)",
            intent.step_id,
            intent.workflow_id,
            type(error).__name__,
        )


def _nothing_sent(
    error: Exception, what: str = "could not record the step's intent"
) -> ToolAttemptResult:
    reason = f"nothing sent: {what} ({type(error).__name__})"
    return ToolAttemptResult(
        outcome=OutcomeClass.TRANSIENT, reason=reason, database_unavailable=is_unreachable(error)
    )


async def _attempt(
    tool: Tool, implementation: Implementation, call: ToolCall[Any], identity: ToolCallInput
) -> ToolAttemptResult:
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
