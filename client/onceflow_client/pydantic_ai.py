"""onceflow's tools as a PydanticAI toolset, with a person in the loop through PydanticAI's
deferred tools. Needs the extra: ``pip install 'onceflow-client[pydantic-ai]'``.

One agent conversation is one open task: the toolset creates it at the conversation's
first tool call, keyed by the conversation id, and sends each tool call as a call of that
task keyed by the conversation and the model's tool-call id, so the same tool call sent
again (a lost answer, a framework retry, a resumed run) is the same call, never a second
effect. Retries of an effect belong to onceflow: the toolset never calls a tool again on
its own. A call awaiting approval is one of PydanticAI's approvals, answered with its own
``ToolApproved`` / ``ToolDenied``; the toolset hands the answer to onceflow as its
``approver`` (a principal of ``onceflow principal add --approvals``), and onceflow binds it
to the call's exact arguments and records who decided::

    from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
    from onceflow_client import OnceflowClient
    from onceflow_client.pydantic_ai import OnceflowToolset

    async with (
        OnceflowClient(URL, api_key=AGENT_KEY) as onceflow,
        OnceflowClient(URL, api_key=APPROVER_KEY) as approver,
    ):
        toolset = await OnceflowToolset.from_gateway(
            onceflow, tools=["refund_payment"], approver=approver
        )
        agent = Agent(model, toolsets=[toolset], output_type=[str, DeferredToolRequests])
        result = await agent.run("Refund order 1042")
        while isinstance(result.output, DeferredToolRequests):
            answers = DeferredToolResults(approvals={  # ToolApproved() or ToolDenied("why")
                call.tool_call_id: ask_a_person(call) for call in result.output.approvals
            })
            decided = await toolset.wait_for_decisions(result.output, answers)
            result = await agent.run(
                message_history=result.all_messages(), deferred_tool_results=decided
            )
        await toolset.close(result)

Hand the answers over through ``wait_for_decisions``: PydanticAI answers a ``ToolDenied``
itself, without calling the toolset, so a denial given straight to ``agent.run`` would
never reach onceflow (an approval would: the run's call of the tool approves it).

What the model is told about each call::

    succeeded                         the tool's result
    answered by the repeat guard      "already done: <result>" (nothing ran again)
    awaiting approval                 nothing: the run ends with it in
                                      DeferredToolRequests.approvals
    parked (outcome unknown)          nothing: the run ends with it in
                                      DeferredToolRequests.calls; an operator reconciles
    no answer yet (lost, still busy)  nothing: the run ends with it in .calls;
                                      wait_for_decisions asks for the same call again
    invalid arguments, rejected       ModelRetry: nothing happened, fix the arguments
    denied                            ToolDenied: the person's message (ToolFailed
                                      for a later call the repeat guard answers)
    failed, abandoned, refused        ToolFailed: told plainly, not invited to retry
    by the task
"""

import asyncio
import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import httpx
from pydantic_ai import (
    ApprovalRequired,
    CallDeferred,
    DeferredToolRequests,
    DeferredToolResults,
    ModelRetry,
    RunContext,
    ToolApproved,
    ToolDenied,
    UserError,
)
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.run import AgentRunResult
from pydantic_ai.tools import AgentDepsT
from pydantic_ai.toolsets import ToolsetTool

from onceflow_client._approvals import decide_call
from onceflow_client._client import (
    SETTLE_TIMEOUT,
    CallResult,
    OnceflowClient,
    OnceflowError,
    OpenTask,
)
from onceflow_client._pydantic_ai_catalogue import METADATA_KEY, CatalogueToolset
from onceflow_client._pydantic_ai_told import (
    ALREADY_DONE,
    denial,
    describe_failure,
    reconcile_command,
    told,
    told_about_refusal,
)

__all__ = ["ALREADY_DONE", "OnceflowToolset", "WaitingCall", "waiting_calls"]

_CALL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
"""What a call id of an open task may look like (the gateway's pattern)."""
_SETTLE_PAUSE = 0.5
_APPROVED = "approved in the agent's run (PydanticAI's ToolApproved)"
"""The reason onceflow records with an approval: ``ToolApproved`` carries none."""
_NO_APPROVER = (
    "an approval was answered, but the toolset has no approver to hand it to onceflow: "
    "OnceflowToolset(..., approver=OnceflowClient(url, api_key=<a key of `onceflow "
    "principal add --approvals`>))"
)


@dataclass(frozen=True)
class WaitingCall:
    """A tool call the run stopped at, as ``DeferredToolRequests`` carries it."""

    tool_call_id: str
    tool: str
    task_id: str
    step_id: str
    """The call's step in the task: what ``onceflow approve`` / ``reconcile`` name."""
    state: str
    """``awaiting_approval`` (in ``DeferredToolRequests.approvals``), ``parked``, or
    ``unanswered`` / a running state when onceflow's answer did not arrive in time (nobody
    needs to decide: ask again); all but the first are in ``.calls``."""
    reason: str | None
    """Why it waits (the park reason, or what went wrong with the answer)."""
    reconcile_command: str | None
    """For a parked call: the exact command an operator runs to decide."""
    arguments_digest: str | None
    """What an approval of the call is bound to (``POST /v1/tasks/{id}/approve``)."""

    @property
    def needs_person(self) -> bool:
        """Whether a person must decide (approve, or reconcile) before it ends."""
        return self.state in ("parked", "awaiting_approval")


def waiting_calls(requests: DeferredToolRequests) -> list[WaitingCall]:
    """The onceflow calls among ``requests``, its approvals included (other toolsets'
    deferred calls are left out)."""
    waiting = []
    for part in [*requests.calls, *requests.approvals]:
        details = requests.metadata.get(part.tool_call_id, {}).get(METADATA_KEY)
        if details is None:
            continue
        waiting.append(
            WaitingCall(
                tool_call_id=part.tool_call_id,
                tool=str(details["tool"]),
                task_id=str(details["task_id"]),
                step_id=str(details["step_id"]),
                state=str(details["state"]),
                reason=details.get("reason"),
                reconcile_command=details.get("reconcile_command"),
                arguments_digest=details.get("arguments_digest"),
            )
        )
    return waiting


class OnceflowToolset(CatalogueToolset[AgentDepsT]):
    """onceflow's catalogue (all of it, or the tools named) as one PydanticAI toolset.

    Build it with ``await OnceflowToolset.from_gateway(...)`` (which reads
    ``GET /v1/tools``), give it to an ``Agent`` whose ``output_type`` includes
    ``DeferredToolRequests``, and close the conversation's task with ``await
    toolset.close(result)`` when the agent is done (else it closes itself after its idle
    timeout). Do not give its tools a PydanticAI timeout: a call that takes long ends the
    run with deferred requests instead (``settle_timeout``). Its coroutines, each to be
    awaited: ``from_gateway``, ``wait_for_decisions``, ``task_for`` and ``close``
    (``get_tools`` and ``call_tool`` are PydanticAI's to call).
    """

    def __init__(
        self,
        client: OnceflowClient,
        catalogue: Sequence[Mapping[str, Any]],
        *,
        id: str | None = "onceflow",
        budget: dict[str, Any] | None = None,
        idle_timeout: timedelta | float | str | None = None,
        max_lifetime: timedelta | float | str | None = None,
        settle_timeout: float = SETTLE_TIMEOUT,
        max_retries: int = 2,
        approver: OnceflowClient | None = None,
    ) -> None:
        """
        Args:
            client: The gateway, as the agent's principal.
            catalogue: Tool descriptions as ``OnceflowClient.list_tools`` returns them.
            id: The toolset's id among the agent's toolsets. Default ``onceflow``.
            budget: Each conversation task's one retry budget (``RetryBudget`` fields).
                Default: the gateway's.
            idle_timeout: A conversation's task closes after this long without a call.
                Default: the gateway's (30 minutes).
            max_lifetime: No call is taken after this long. Default: the gateway's.
            settle_timeout: Seconds a tool call waits for onceflow to finish, park or ask
                for approval before the run ends with it deferred. Default 60, as in the
                Agents SDK run.
            max_retries: How many times the model may correct the arguments of one tool
                after a validation refusal (``ModelRetry``). Default 2.
            approver: The gateway as the principal whose ``ToolApproved`` / ``ToolDenied``
                answers the app hands over (``onceflow principal add --approvals``); the
                task records its name with each decision. Default None: approvals are
                decided in onceflow only (an operator), and an answer raises ``UserError``.
        """
        self._client = client
        self._approver = approver
        super().__init__(catalogue, id=id, max_retries=max_retries)
        self._task_options: dict[str, Any] = {
            "budget": budget,
            "idle_timeout": idle_timeout,
            "max_lifetime": max_lifetime,
        }
        self._settle_timeout = settle_timeout
        self._tasks: dict[str, OpenTask] = {}
        self._creating = asyncio.Lock()

    @classmethod
    async def from_gateway(
        cls,
        client: OnceflowClient,
        *,
        tools: Collection[str] | None = None,
        **options: Any,
    ) -> "OnceflowToolset[AgentDepsT]":
        """The gateway's catalogue, or the ``tools`` named from it, as a toolset (``await
        OnceflowToolset.from_gateway(client, ...)``).

        Args:
            client: The gateway, as the agent's principal (it must be allowed the tools).
            tools: The tools to offer the model; default every tool of the catalogue.
            **options: As ``OnceflowToolset``'s keyword arguments.

        Raises:
            ValueError: A named tool is not in the catalogue.
        """
        catalogue = await client.list_tools()
        if tools is not None:
            known = {str(tool["name"]) for tool in catalogue}
            if unknown := set(tools) - known:
                raise ValueError(
                    f"not in the gateway's catalogue: {', '.join(sorted(unknown))} "
                    f"(it has {', '.join(sorted(known))})"
                )
            catalogue = [tool for tool in catalogue if tool["name"] in tools]
        return cls(client, catalogue, **options)

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[AgentDepsT],
        tool: ToolsetTool[AgentDepsT],
    ) -> Any:
        """Send the call to the conversation's task; see the module for what the model
        is told. A call PydanticAI approved (``ToolApproved``) that still awaits approval
        in onceflow is approved there first, as the ``approver``."""
        conversation = _conversation_of(ctx)
        if ctx.tool_call_id is None:
            raise ValueError("onceflow tools are called with the model's tool-call id")
        call = _Call(conversation, ctx.tool_call_id, name, dict(tool_args))
        task = await self.task_for(conversation)
        try:
            answer = await self._settled(task, call)
            if ctx.tool_call_approved and answer.state == "awaiting_approval":
                await self._decide(answer, approved=True, reason=_APPROVED)
                answer = await self._settled(task, call)
        except (OnceflowError, httpx.TransportError) as failure:
            refusal = told_about_refusal(failure)
            if refusal is not None:
                raise refusal from None
            # No answer: the call may have reached the task. Asking again with its key
            # is the only safe move, and it is wait_for_decisions' to make.
            raise CallDeferred(
                metadata=call.deferral(task.task_id, "unanswered", describe_failure(failure))
            ) from None
        if not answer.ended:
            reconcile = await reconcile_command(task, answer) if answer.state == "parked" else None
            details = call.deferral(
                task.task_id,
                answer.state,
                answer.park_reason
                or ("waits for a person's approval" if answer.waiting_for_person else None)
                or f"still {answer.state} after {self._settle_timeout:g} s",
                # A repeat waits on the earlier identical call: that is what a person
                # decides.
                step_id=answer.repeat_of or answer.step_id,
                reconcile_command=reconcile,
                arguments_digest=answer.body.get("arguments_digest"),
            )
            if answer.state == "awaiting_approval":
                raise ApprovalRequired(metadata=details)
            raise CallDeferred(metadata=details)
        told_value = await told(task, answer)
        if isinstance(told_value, ModelRetry | ToolFailed):
            raise told_value
        return told_value

    async def wait_for_decisions(
        self,
        requests: DeferredToolRequests,
        results: DeferredToolResults | None = None,
        *,
        timeout: float = 24 * 3600.0,
    ) -> DeferredToolResults:
        """Hand a paused run's onceflow calls to the next run (``decided = await
        toolset.wait_for_decisions(result.output, answers)``, then ``agent.run(...,
        deferred_tool_results=decided)``):

        * an approval the app answered in ``results.approvals`` (``ToolApproved``,
          ``ToolDenied`` or a bool) goes to onceflow as the ``approver``'s: a denial now,
          an approval by the next run's call of the tool;
        * an approval left unanswered waits for a decision made in onceflow (``onceflow
          approve``), and the call's end;
        * a call in ``requests.calls`` (parked, or its answer lost) waits until it has
          ended (an operator reconciled it), asked again under its own key.

        Returns ``results`` (the app's answers to other toolsets' calls kept) with each
        onceflow call answered as onceflow decided it: a denial that came after another
        person's approval is handed over as that approval, so the run tells the outcome.

        Raises:
            TimeoutError: A call had not ended after ``timeout`` seconds (ask again).
            UserError: An approval with ``override_args`` (onceflow's approval is bound to
                the arguments the person saw), or an answer while there is no ``approver``.
            OnceflowError: onceflow refused an answer (e.g. ``PermissionDenied``: the
                approver's principal may not approve).
        """
        answers = dict(results.approvals) if results is not None else {}
        parts = {part.tool_call_id: part for part in [*requests.calls, *requests.approvals]}
        waiting = waiting_calls(requests)
        asks = [
            asyncio.ensure_future(
                self._decided(
                    parts[call.tool_call_id], requests, answers.get(call.tool_call_id), timeout
                )
            )
            for call in waiting
        ]
        try:
            outcomes = await asyncio.gather(*asks)
        except BaseException:
            for ask in asks:
                ask.cancel()
            raise
        decided = DeferredToolResults()
        if results is not None:
            decided.update(results)
        for call, value in zip(waiting, outcomes, strict=True):
            if call.state == "awaiting_approval":
                decided.approvals[call.tool_call_id] = value
            else:
                decided.calls[call.tool_call_id] = value
        return decided

    async def task_for(self, conversation_id: str) -> OpenTask:
        """The open task of a conversation, created at its first call (a coroutine:
        ``await toolset.task_for(conversation_id)``). The creation is keyed by the
        conversation, so another process resuming it finds the same task."""
        async with self._creating:
            task = self._tasks.get(conversation_id)
            if task is None:
                task = await self._client.create_open_task(
                    **self._task_options, idempotency_key=_task_key(conversation_id)
                )
                self._tasks[conversation_id] = task
            return task

    async def close(self, conversation: "AgentRunResult[Any] | str") -> dict[str, Any] | None:
        """Close the task of a conversation (a run's result or its ``conversation_id``;
        ``await toolset.close(result)``): it takes no more calls and ends once its
        unfinished calls end. Returns the task's
        status, or None when this toolset never opened a task for the conversation."""
        conversation_id = (
            conversation if isinstance(conversation, str) else conversation.conversation_id
        )
        async with self._creating:
            task = self._tasks.pop(conversation_id, None)
        return await task.close() if task is not None else None

    async def _settled(self, task: OpenTask, call: "_Call") -> CallResult:
        """The call's answer once it ended, parked or awaits approval, or the last one
        when ``settle_timeout`` is over first. Asking again sends the same key."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_timeout
        answer = await call.send(task, wait="settled")
        while not (answer.ended or answer.waiting_for_person) and loop.time() < deadline:
            asked_at = loop.time()
            answer = await call.send(task, wait="settled")
            if loop.time() - asked_at < _SETTLE_PAUSE:
                # The gateway did not hold the request open: do not spin on it.
                await asyncio.sleep(_SETTLE_PAUSE)
        return answer

    async def _decided(
        self, part: ToolCallPart, requests: DeferredToolRequests, answer: Any, timeout: float
    ) -> Any:
        details = requests.metadata[part.tool_call_id][METADATA_KEY]
        call = _Call(
            str(details["conversation_id"]),
            part.tool_call_id,
            str(details["tool"]),
            part.args_as_dict(),
        )
        task = await self.task_for(call.conversation_id)
        approval = details["state"] == "awaiting_approval"
        if approval and answer is not None:
            return await self._answered(task, call, answer)
        try:
            ended = await call.send(task, wait="ended", timeout=timeout)
        except (OnceflowError, httpx.TransportError) as failure:
            refusal = told_about_refusal(failure)
            if refusal is None:
                raise
            return refusal
        if approval:
            # An approval is answered as one: the run calls the tool, which tells the outcome.
            return ToolDenied(denial(ended)) if ended.state == "denied" else ToolApproved()
        return await told(task, ended)

    async def _answered(self, task: OpenTask, call: "_Call", answer: Any) -> Any:
        """The app's answer to an approval, as onceflow took it."""
        if isinstance(answer, ToolApproved) and answer.override_args is not None:
            raise UserError(
                "onceflow approves a call's exact arguments: answer with ToolApproved() "
                "(the model can call the tool anew with other arguments)"
            )
        if answer is True or isinstance(answer, ToolApproved):
            if self._approver is None:
                raise UserError(_NO_APPROVER)
            return ToolApproved()  # approved by the next run's call of the tool
        denied = answer if isinstance(answer, ToolDenied) else ToolDenied()
        current = await call.send(task, wait="settled")
        if current.state == "awaiting_approval":
            await self._decide(current, approved=False, reason=denied.message)
            current = await call.send(task, wait="settled")
        return denied if current.state == "denied" else ToolApproved()

    async def _decide(self, answer: CallResult, *, approved: bool, reason: str) -> None:
        if self._approver is None:
            raise UserError(_NO_APPROVER)
        await decide_call(self._approver, answer, approved=approved, reason=reason)


@dataclass(frozen=True)
class _Call:
    """One model tool call, and the identity it has in onceflow."""

    conversation_id: str
    tool_call_id: str
    tool: str
    arguments: dict[str, Any]

    @property
    def call_id(self) -> str:
        """The model's tool-call id when it fits the task's call ids, else one derived."""
        if _CALL_ID.match(self.tool_call_id):
            return self.tool_call_id
        return f"call-{_digest('call-id', self.tool_call_id)[:40]}"

    @property
    def idempotency_key(self) -> str:
        # Keys are scoped per principal, not per task: the conversation keeps two
        # conversations' equal tool-call ids apart.
        return f"pydantic-ai.call.{_digest('call', self.conversation_id, self.tool_call_id)[:48]}"

    async def send(
        self, task: OpenTask, *, wait: Literal["settled", "ended"], timeout: float = 300.0
    ) -> CallResult:
        return await task.call(
            self.tool,
            self.arguments,
            call_id=self.call_id,
            idempotency_key=self.idempotency_key,
            wait=wait,
            timeout=timeout,
        )

    def deferral(
        self,
        task_id: str,
        state: str,
        reason: str | None,
        *,
        step_id: str | None = None,
        reconcile_command: str | None = None,
        arguments_digest: str | None = None,
    ) -> dict[str, Any]:
        return {
            METADATA_KEY: {
                "conversation_id": self.conversation_id,
                "task_id": task_id,
                "step_id": step_id or self.call_id,
                "tool": self.tool,
                "state": state,
                "reason": reason,
                "reconcile_command": reconcile_command,
                "arguments_digest": arguments_digest,
            }
        }


def _conversation_of(ctx: RunContext[Any]) -> str:
    conversation = ctx.conversation_id or ctx.run_id
    if not conversation:
        raise ValueError("onceflow tools are called inside an agent run")
    return conversation


def _task_key(conversation_id: str) -> str:
    return f"pydantic-ai.task.{_digest('task', conversation_id)[:48]}"


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()
