"""onceflow for the OpenAI Agents SDK: one agent run is one open task, each tool call one
call of it, and a call a person must decide on pauses the run with the SDK's own approval
interruption. Needs the extra: ``pip install 'onceflow-client[openai-agents]'``.

::

    from agents import Agent, Runner
    from onceflow_client import OnceflowClient
    from onceflow_client.openai_agents import OnceflowRun

    async with (
        OnceflowClient(url, api_key=AGENT_KEY) as onceflow,
        OnceflowClient(url, api_key=APPROVER_KEY) as approver,  # principal add --approvals
        OnceflowRun(onceflow, tools=["refund_payment"], approver=approver) as run,
    ):
        agent = Agent(name="support", instructions=..., tools=run.tools)
        result = await Runner.run(agent, "Refund order ord-42 and tell the customer.")
        while result.interruptions:                  # onceflow waits for a person
            state = result.to_state()
            for item in run.approvals(result.interruptions):  # the approval screen
                if ask_a_person(item):
                    state.approve(item)
                else:
                    state.reject(item, rejection_message="over the goodwill limit")
            await run.wait_for_decisions(state)      # sent to onceflow; parked calls
            result = await Runner.run(agent, state)  # wait for an operator

One tool call, keyed by the run and the model's tool-call id (the SDK asking again for the
same call id, in this process or after a restart with the same ``run_id``, is the same
call, never a second effect)::

    the SDK asks whether the call needs approval
      │  the call goes to the run's open task now (key: run id + call id; step id: call id)
      ├─ ended ─────────────────────────▶ no: the tool answers from it at once
      ├─ refused before anything ran ───▶ no: the tool answers with the refusal
      └─ awaiting approval, parked, ────▶ yes: the run ends with an interruption
         still running                     │ awaiting approval: the app approves or
                                           │ rejects it in the RunState, and
                                           │ wait_for_decisions sends that to onceflow as
                                           │ the approver; parked: an operator reconciles
                                           │ it in onceflow (the app cannot), and
                                           ▼ wait_for_decisions waits for that
                                 Runner.run(agent, state): the tool asks again with the
                                 same key and answers with onceflow's decided outcome

What the model reads (the tool's output)::

    succeeded                 the tool's result as JSON
    answered by the repeat    already done: <the earlier call's result as JSON>
      guard
    failed, or refused        error: <why>. Nothing was done; ... (so it can correct its
      before it ran             arguments: the SDK's usual tool error text)
    denied                    denied: a person did not approve this call; it did not run.
    abandoned, parked, still  says plainly that the effect may exist, that a person is
      waiting, unreachable,     deciding (or deciding what happened), and that the call
      timed out, cancelled      must not be repeated: never "error, try again".

The adapter never retries a tool call: the client resends one request with the same key
when its answer is lost (the same call), and onceflow's task owns every retry of an
effect. The SDK's default failure handler ("An error occurred... Please try again.") is
replaced on these tools, and a timeout a caller sets on one answers the same plain way.

Because the call is sent when the SDK asks whether it needs approval, tool input
guardrails and ``on_tool_start`` hooks run after onceflow has the call; put checks that
must stop a call before it happens in the tool's contract (validation, approval) instead.
Hand every decision over through ``wait_for_decisions``: the SDK answers a rejected call
itself, without calling the tool, so only it can tell onceflow (an approval alone would
reach onceflow when the resumed run calls the tool). Never ``always_approve`` or
``always_reject`` these tools: that stops the SDK asking, so a later call cannot pause the
run, and onceflow decides each call on its own arguments.
"""

import asyncio
import hashlib
import json
import re
import uuid
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext

from onceflow_client._approvals import decide_call
from onceflow_client._client import (
    SETTLE_TIMEOUT,
    CallResult,
    OnceflowClient,
    OnceflowError,
    OpenTask,
)

__all__ = ["ALREADY_DONE", "OnceflowRun"]

T = TypeVar("T")

ALREADY_DONE = "already done: "
"""How the output of a call answered by the repeat guard starts: nothing ran for it."""

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
"""What a run id and a call's step id may be (the gateway's name pattern)."""
_NOT_RUN = "Nothing was done"
_APPROVED = "approved in the agent's run (RunState.approve)"
_REJECTED = "rejected in the agent's run (RunState.reject)"
"""The reasons onceflow records with a decision that carries none of its own."""
_DO_NOT_REPEAT = (
    "Do not call this tool again for it, not even with other arguments; tell the user "
    "it is pending."
)


class OnceflowRun:
    """One agent run's open task and the function tools that call it.

    Use it as ``async with OnceflowRun(onceflow, tools=[...]) as run:`` around the whole
    run, resumes included (leaving the block closes the task), or ``await run.load()``
    and, once the run has ended, ``await run.close()``. Its coroutines, each to be
    awaited: ``load``, ``wait_for_decisions`` and ``close``. To resume a run in another
    process (a ``RunState`` saved while a person decides), make the ``OnceflowRun`` again
    with the same ``run_id`` and the same task options: it finds the same open task and
    the same calls.
    """

    def __init__(
        self,
        onceflow: OnceflowClient,
        *,
        tools: Sequence[str] | None = None,
        run_id: str | None = None,
        budget: dict[str, Any] | None = None,
        idle_timeout: timedelta | float | str | None = None,
        max_lifetime: timedelta | float | str | None = None,
        settle_timeout: float = SETTLE_TIMEOUT,
        decision_timeout: float = 60.0,
        retries: int = 2,
        approver: OnceflowClient | None = None,
    ) -> None:
        """Describe the run; ``load`` (or ``async with``) reads the catalogue and opens
        the task.

        Args:
            onceflow: The client, as the agent's principal.
            tools: Names of the catalogue's tools to offer the model, in this order.
                Default: every tool of the catalogue.
            run_id: The run's identity, in every key the run sends (letters, digits and
                ``_.:-``, at most 64). Default: a new one; keep it to resume elsewhere.
            budget: The open task's retry budget (``RetryBudget`` fields). Default: the
                gateway's.
            idle_timeout: The task closes after this long without a call. Default: the
                gateway's (30 minutes).
            max_lifetime: No call is accepted after this long. Default: the gateway's (1 day).
            settle_timeout: Seconds a tool call may run before the run is paused with an
                interruption for it (onceflow keeps running it). Default 60, as in the
                PydanticAI toolset.
            decision_timeout: Seconds a resumed tool call waits for onceflow's decided
                outcome before telling the model that a person is still deciding. Default 60.
            retries: Resends of one request with the same key (lost answers, 503, 429).
                Default 2.
            approver: The client, as the principal whose approvals and rejections in the
                ``RunState`` are sent to onceflow (``onceflow principal add --approvals``);
                the task records its name with each decision. Default None: calls
                awaiting approval are decided in onceflow only (an operator).
        """
        if run_id is not None and not _ID.match(run_id):
            raise ValueError("run_id: letters, digits and _.:- only, at most 64")
        self._onceflow = onceflow
        self._names = list(tools) if tools is not None else None
        self.run_id = run_id or uuid.uuid4().hex
        """The run's identity, part of every key it sends."""
        self._task_options: dict[str, Any] = {
            "budget": budget,
            "idle_timeout": idle_timeout,
            "max_lifetime": max_lifetime,
        }
        self._settle_timeout = settle_timeout
        self._decision_timeout = decision_timeout
        self._retries = retries
        self._approver = approver
        self._tools: list[FunctionTool] | None = None
        self._task: OpenTask | None = None
        self._answers: dict[str, CallResult | str] = {}
        """By the model's tool-call id: onceflow's latest answer, or the model's text for
        a call that ended without one (refused before it ran)."""

    async def __aenter__(self) -> Self:
        await self.load()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.close()
            return
        try:
            await self.close()
        except (OnceflowError, httpx.HTTPError):
            pass  # the block's own error says more

    @property
    def tools(self) -> list[FunctionTool]:
        """The function tools for an ``agents.Agent`` (after ``load``)."""
        if self._tools is None:
            raise RuntimeError("OnceflowRun.load() first (or use it with async with)")
        return list(self._tools)

    @property
    def task_id(self) -> str:
        """The open task's id (its workflow id): what an operator's decision names."""
        return self._open_task().task_id

    async def load(self) -> None:
        """Read the catalogue, build the tools and open the run's task (or find it again,
        for a ``run_id`` that opened one before): ``await run.load()``."""
        specs = await self._onceflow.list_tools()
        if self._names is not None:
            by_name = {str(spec["name"]): spec for spec in specs}
            unknown = [name for name in self._names if name not in by_name]
            if unknown:
                raise ValueError(f"not in onceflow's catalogue: {', '.join(unknown)}")
            specs = [by_name[name] for name in self._names]
        self._task = await self._onceflow.create_open_task(
            **self._task_options, idempotency_key=f"ofr-{self.run_id}-task", retries=self._retries
        )
        self._tools = [self._function_tool(spec) for spec in specs]

    async def close(self) -> None:
        """Close the task (``await run.close()``): it takes no more calls; calls still
        waiting keep their decisions. Safe to repeat."""
        if self._task is not None:
            await self._task.close()

    def waiting_calls(self, interruptions: Sequence[ToolApprovalItem]) -> list[CallResult]:
        """onceflow's answers behind these interruptions (this process's), for telling a
        person what to decide: ``step_id``, ``state``, ``park_reason``, ``task_id``."""
        waiting = []
        for item in interruptions:
            answer = self._answers.get(item.call_id or "")
            if isinstance(answer, CallResult) and not answer.ended:
                waiting.append(answer)
        return waiting

    def approvals(self, interruptions: Sequence[ToolApprovalItem]) -> list[ToolApprovalItem]:
        """The interruptions of calls awaiting approval (this process's): what the app's
        approval screen answers with ``state.approve(item)`` or ``state.reject(item)``.
        The others are parked or still running: an operator decides those in onceflow."""
        return [
            item
            for item in interruptions
            if isinstance(answer := self._answers.get(item.call_id or ""), CallResult)
            and answer.state == "awaiting_approval"
        ]

    async def wait_for_decisions(
        self, state: RunState[Any, Any], *, timeout: float = 300.0
    ) -> list[CallResult]:
        """Hand this run's interruptions in ``state`` to onceflow and wait until each call
        has ended (``await run.wait_for_decisions(state)``, then ``Runner.run(agent,
        state)``):

        * a call awaiting approval that the app approved or rejected in ``state``: the
          decision goes to onceflow as the ``approver``'s (a rejection message as its
          reason);
        * one the app left undecided waits for a decision made in onceflow (``onceflow
          approve``);
        * a parked call waits for an operator's reconciliation: the app cannot decide
          whether its effect happened.

        Then ``state`` holds onceflow's outcome: a call the app rejected and onceflow
        denied stays rejected (in onceflow's words for the model unless the app gave its
        own); every other call is approved, and the tool answers with what happened, a
        denial included. Interruptions of other tools are left to the caller.

        Raises:
            TimeoutError: Some call had not ended after ``timeout`` seconds; waiting
                again later is safe (decisions sent stay sent).
            ValueError: The app rejected a parked or running call, or decided one while
                there is no ``approver``; nothing was sent.
            OnceflowError: onceflow refused a decision (e.g. ``PermissionDenied``).
        """
        ours = {tool.name for tool in self.tools}
        items = [item for item in state.get_interruptions() if item.name in ours]
        # The SDK keeps the app's decisions in the state's context (the state has no
        # reader of its own): True, False, or None while undecided.
        context = state._context
        wanted = [
            context.get_approval_status(item.name or "", item.call_id or "", existing_pending=item)
            if context is not None
            else None
            for item in items
        ]
        async with asyncio.timeout(timeout):
            known = await _together(*(self._known(item) for item in items))
            for item, answer, decision in zip(items, known, wanted, strict=True):
                self._check_decidable(item, answer, decision)
            decided = await _together(
                *(
                    self._decided(item, answer, decision, context)
                    for item, answer, decision in zip(items, known, wanted, strict=True)
                )
            )
        for item, answer, decision in zip(items, decided, wanted, strict=True):
            if answer is None or answer.state != "denied" or decision is not False:
                state.approve(item)
            elif (
                context is None
                or context.get_rejection_message(
                    item.name or "", item.call_id or "", existing_pending=item
                )
                is None
            ):
                state.reject(item, rejection_message=_describe(answer))
        return [answer for answer in decided if answer is not None]

    # ── one tool call ───────────────────────────────────────────────────────────────

    def _function_tool(self, spec: dict[str, Any]) -> FunctionTool:
        name = str(spec["name"])
        tool = FunctionTool(
            name=name,
            description=str(spec.get("description") or name),
            params_json_schema=dict(spec.get("input_schema") or {"type": "object"}),
            on_invoke_tool=partial(self._invoke, name),
            # The contract's schema as it is: optional fields stay optional (strict mode
            # would make the model send every field).
            strict_json_schema=False,
            needs_approval=partial(self._needs_person, name),
            timeout_error_function=_interrupted_text,
        )
        # The SDK's default turns any failure into "error, try again" for the model.
        return set_function_tool_failure_error_function(tool, _interrupted_text)

    async def _needs_person(
        self, tool: str, context: RunContextWrapper[Any], arguments: dict[str, Any], call_id: str
    ) -> bool:
        """The SDK's approval question: send the call now and pause the run (True) when
        onceflow has not ended it. Never raises: a failure is the tool's answer."""
        known = self._answers.get(call_id)
        if known is None:
            try:
                known = await self._settle(tool, arguments, call_id)
            except OnceflowError as refused:
                if not _nothing_ran(refused):
                    return False  # the tool asks again with the same key and says so
                known = self._answers[call_id] = _refusal_text(refused)
            except httpx.HTTPError:
                return False
        return isinstance(known, CallResult) and not known.ended

    async def _invoke(self, tool: str, context: ToolContext[Any], arguments: str) -> str:
        """The tool's answer: onceflow's outcome of the call, waited for when a person
        decides, in words that never invite a repeat of an effect that may exist."""
        call_id = context.tool_call_id
        known = self._answers.get(call_id)
        if isinstance(known, str):
            return known
        try:
            if known is None:
                # The SDK did not ask first (the call was approved before it was sent).
                parsed = _arguments(arguments)
                if isinstance(parsed, str):
                    return parsed
                known = await self._settle(tool, parsed, call_id)
            if known.state == "awaiting_approval" and self._approver is not None:
                # The SDK approved it (only then is the tool called), and nothing told
                # onceflow yet: the app resumed without wait_for_decisions.
                try:
                    await decide_call(self._approver, known, approved=True, reason=_APPROVED)
                except OnceflowError:
                    return _waiting_text(known)
            if not known.ended:
                known = await self._ended(call_id, known, self._decision_timeout)
        except TimeoutError:
            latest = self._answers[call_id]
            return _waiting_text(latest) if isinstance(latest, CallResult) else latest
        except OnceflowError as refused:
            return _refusal_text(refused) if _nothing_ran(refused) else _unknown_text(refused)
        except httpx.HTTPError as failure:
            return _unknown_text(failure)
        return _describe(known)

    async def _known(self, item: ToolApprovalItem) -> CallResult | None:
        """onceflow's latest answer behind an interruption; None when the tool answers
        with an error text (the call was refused, or its arguments unreadable)."""
        call_id = item.call_id or ""
        known = self._answers.get(call_id)
        if isinstance(known, str):
            return None
        if known is None:
            # Another process paused the run: asking with the same key finds the call.
            parsed = _arguments(item.arguments or "")
            if isinstance(parsed, str):
                return None  # the tool answers with the error when the run resumes
            known = await self._settle(item.name or "", parsed, call_id)
        return known

    def _check_decidable(
        self, item: ToolApprovalItem, answer: CallResult | None, decision: bool | None
    ) -> None:
        if answer is None or decision is None or answer.ended:
            return
        if answer.state != "awaiting_approval":
            if decision is False:
                raise ValueError(
                    f"call {item.call_id} is {answer.state}, not awaiting approval: whether "
                    "its effect happened is an operator's to reconcile in onceflow "
                    f"({answer.park_reason or 'it may take effect'}); do not reject it"
                )
        elif self._approver is None:
            raise ValueError(
                f"call {item.call_id} was decided in the RunState, but this run has no "
                "approver to hand it to onceflow: OnceflowRun(..., approver=OnceflowClient("
                "url, api_key=<a key of `onceflow principal add --approvals`>))"
            )

    async def _decided(
        self,
        item: ToolApprovalItem,
        known: CallResult | None,
        decision: bool | None,
        context: RunContextWrapper[Any] | None,
    ) -> CallResult | None:
        if known is None or known.ended:
            return known
        if known.state == "awaiting_approval" and decision is not None:
            assert self._approver is not None  # checked before anything was sent
            rejected = (
                context.get_rejection_message(
                    item.name or "", item.call_id or "", existing_pending=item
                )
                if context is not None
                else None
            )
            reason = _APPROVED if decision else rejected or _REJECTED
            await decide_call(self._approver, known, approved=decision, reason=reason)
        return await self._ended(item.call_id or "", known, timeout=None)

    async def _ended(self, call_id: str, answer: CallResult, timeout: float | None) -> CallResult:
        """Ask again (same key) until the call has ended; ``None``: no limit of its own."""
        ended = await self._open_task().wait(
            answer, timeout=timeout if timeout is not None else float("inf"), retries=self._retries
        )
        self._answers[call_id] = ended
        return ended

    async def _settle(self, tool: str, arguments: dict[str, Any], call_id: str) -> CallResult:
        """Send the call (or ask for it again: same key) until it has ended, waits for a
        person, or ``settle_timeout`` passed."""
        task = self._open_task()
        step_id = _step_id(call_id)
        key = f"ofr-{self.run_id}-call-{step_id}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_timeout
        while True:
            asked_at = loop.time()
            answer = await task.call(
                tool, arguments, call_id=step_id, idempotency_key=key, retries=self._retries
            )
            self._answers[call_id] = answer
            if answer.ended or answer.waiting_for_person or loop.time() >= deadline:
                return answer
            if loop.time() - asked_at < 1.0:
                # The gateway did not hold the request open: do not spin on it.
                await asyncio.sleep(min(1.0, max(deadline - loop.time(), 0)))

    def _open_task(self) -> OpenTask:
        if self._task is None:
            raise RuntimeError("OnceflowRun.load() first (or use it with async with)")
        return self._task


async def _together(*steps: Awaitable[T]) -> list[T]:
    """All of ``steps`` side by side; the first failure cancels the others."""
    running = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*running))
    except BaseException:
        for step in running:
            step.cancel()
        raise


def _step_id(call_id: str) -> str:
    """The call's step id: the model's tool-call id when the gateway takes it as one (so
    the model can name it, e.g. a refund's ``charge_step``), else a digest of it."""
    if _ID.match(call_id):
        return call_id
    return "call-" + hashlib.sha256(call_id.encode()).hexdigest()[:40]


def _arguments(arguments: str) -> dict[str, Any] | str:
    """The model's arguments as an object, or the error text the model reads."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError as error:
        return f"error: the arguments are not valid JSON ({error}). {_NOT_RUN}."
    if not isinstance(parsed, dict):
        return f"error: the arguments must be a JSON object. {_NOT_RUN}."
    return parsed


def _nothing_ran(refused: OnceflowError) -> bool:
    """Whether the gateway refused the request before anything of it ran: every 4xx but
    a call still in progress under its key."""
    return refused.status < 500 and refused.problem_type != "request-in-progress"


def _describe(answer: CallResult) -> str:
    result = json.dumps(answer.result or {"resource_id": answer.resource_id})
    if answer.state == "succeeded":
        return f"{ALREADY_DONE}{result}" if answer.repeat_of else result
    if answer.state == "failed":
        reason = answer.failure_reason or "the call failed"
        return f"error: {reason}. {_NOT_RUN}; correct the arguments before calling again."
    if answer.state == "denied":
        why = f" ({answer.failure_reason})" if answer.failure_reason else ""
        return (
            f"denied: a person did not approve this call{why}; it did not run. Do not "
            "call it again unless the user asks for it anew."
        )
    if answer.state == "abandoned":
        return (
            "abandoned: a person stopped this call without confirming whether it took "
            f"effect; it may have. {_DO_NOT_REPEAT}"
        )
    return _waiting_text(answer)


def _waiting_text(answer: CallResult) -> str:
    if answer.state == "awaiting_approval":
        why = "it waits for a person's approval"
    elif answer.state == "parked":
        why = (
            "its outcome is unknown and a person is finding out whether it took effect "
            f"({answer.park_reason or 'parked'}); it may have"
        )
    else:
        why = f"it is still {answer.state} in onceflow; it may take effect"
    return f"waiting for a person: {why}. {_DO_NOT_REPEAT}"


def _refusal_text(refused: OnceflowError) -> str:
    problem = refused.problem
    detail = problem.get("reason") or problem.get("detail") or problem.get("errors") or refused
    return f"error: {detail}. {_NOT_RUN}; correct the call before calling again."


def _unknown_text(failure: Exception) -> str:
    return (
        f"outcome unknown: onceflow's answer did not arrive ({type(failure).__name__}); "
        f"the call may have taken effect. {_DO_NOT_REPEAT}"
    )


def _interrupted_text(context: RunContextWrapper[Any], error: Exception) -> str:
    """The model's text when the SDK stops a call (a timeout, a cancellation)."""
    return (
        f"outcome unknown: the call was interrupted ({type(error).__name__}) before "
        f"onceflow's answer arrived; it may have taken effect. {_DO_NOT_REPEAT}"
    )
