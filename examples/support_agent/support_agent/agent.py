"""The support agent: a PydanticAI ``Agent`` whose tools are onceflow's.

It looks the order up, refunds it and emails the customer, through
``onceflow_client.pydantic_ai.OnceflowToolset``: the conversation is one open task, a
repeated call is answered by the earlier one, and a call a person must decide (a parked
refund, a large one awaiting approval) ends the run with PydanticAI's deferred tool
requests. The agent then says who must decide and how, waits for the decision, and
resumes the run with it.

Offline by default: a scripted model (``ScriptedSupportModel``) plays the LLM the way
real ones behave under trouble. It loses track of the refund's answer and asks for the
same refund again, and the network loses onceflow's answer to the email (the client asks
again with the same key). Give it a model and that model's API key, and the same agent
runs against a real LLM::

    python -m support_agent --api-key KEY --order ord-123                  # scripted
    SUPPORT_AGENT_MODEL=openai:gpt-4o OPENAI_API_KEY=... \\
        python -m support_agent --api-key KEY --order ord-123              # a real model

Only the client and PydanticAI are imported here: an agent runtime never installs the
server.
"""

import argparse
import asyncio
import json
import os
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from onceflow_client import OnceflowClient
from onceflow_client.pydantic_ai import ALREADY_DONE, OnceflowToolset, WaitingCall, waiting_calls
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    ModelRetry,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import ToolsetTool, WrapperToolset

TOOLS = ("look_up_order", "refund_payment", "send_email")
"""What the support agent may call (its principal must be allowed them)."""
INSTRUCTIONS = (
    "You are a shop's support agent. When a customer reports a broken order: look the "
    "order up, refund what they paid (the order's amount, reason requested_by_customer, "
    "by its payment_intent), then email the customer at the order's address, quoting the "
    "refund id. Tool answers starting with 'already done:' mean an identical earlier call "
    "did it: never ask for an effect twice. Finish with one sentence on what you did."
)
BUDGET = {"max_attempts_per_step": 3, "initial_backoff": 0.2, "max_backoff": 2.0}
"""The conversation task's one retry budget: onceflow retries, the agent never does."""

Event = dict[str, Any]
Report = Callable[[Event], None]
WhenWaiting = Callable[[list[WaitingCall]], Awaitable[None]]


def prompt_for(order_id: str) -> str:
    """What the customer writes."""
    return f"A customer writes: my order {order_id} arrived broken, please refund it."


class ScriptedSupportModel:
    """Plays the LLM offline, deciding each turn from what it has been told so far.

    It looks the order up, refunds it, then (having lost track of that answer, as models
    do) asks for the same refund again, emails the customer and sums up.
    """

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        told = _tool_returns(messages)
        order_id = _order_id(messages)
        if "lookup" not in told:
            return _calls(("look_up_order", {"order_id": order_id}, "lookup"))
        order = told["lookup"].content
        if not isinstance(order, dict):
            return ModelResponse(parts=[TextPart(f"I could not find order {order_id}.")])
        refund = {
            "payment_intent": order["payment_intent"],
            "amount": order["amount"],
            "reason": "requested_by_customer",
        }
        if "refund" not in told:
            return _calls(("refund_payment", refund, "refund"))
        refunded = told["refund"].content
        if not isinstance(refunded, dict):
            return ModelResponse(parts=[TextPart(f"I could not refund {order_id}: {refunded}")])
        if "refund-again" not in told:
            return _calls(("refund_payment", refund, "refund-again"))
        money = f"{order['amount'] / 100:.2f} {order['currency'].upper()}"
        if "email" not in told:
            return _calls(
                (
                    "send_email",
                    {
                        "to": [order["customer_email"]],
                        "subject": f"Your refund for order {order_id}",
                        "body": f"We are sorry about {order['item']}. We refunded {money} "
                        f"(refund {refunded['refund']}).",
                    },
                    "email",
                )
            )
        return ModelResponse(
            parts=[
                TextPart(
                    f"Refunded {money} for order {order_id} (refund {refunded['refund']}) "
                    f"and emailed {order['customer_email']}."
                )
            ]
        )


async def run_support_agent(
    onceflow: OnceflowClient,
    order_id: str,
    *,
    model: Model | str | None = None,
    report: Report = lambda event: None,
    when_waiting: WhenWaiting | None = None,
    decision_timeout: float = 3600.0,
) -> str:
    """Handle one customer's broken order to the model's final answer.

    Args:
        onceflow: The gateway, as the support agent's principal.
        order_id: The order the customer writes about.
        model: A PydanticAI model or model name; default the scripted one.
        report: Receives each event: what the model asked, what it was told, what
            waits for a person, what onceflow did, the final answer.
        when_waiting: Called when the run stopped at calls a person must decide, before
            the agent waits for the decisions (a demo plays the operator here).
        decision_timeout: Seconds to wait for the decisions.

    Returns:
        The model's final answer.
    """
    toolset = await OnceflowToolset[None].from_gateway(onceflow, tools=TOOLS, budget=BUDGET)
    shown = _Shown(report)
    agent = Agent(
        model or FunctionModel(ScriptedSupportModel(), model_name="scripted-support-agent"),
        toolsets=[_Reporting(toolset, shown)],
        instructions=INSTRUCTIONS,
        output_type=[str, DeferredToolRequests],
    )
    result = await agent.run(prompt_for(order_id))
    while isinstance(result.output, DeferredToolRequests):
        waiting = waiting_calls(result.output)
        for call in waiting:
            report({"event": "waiting", **_waiting_event(call)})
        if when_waiting is not None:
            await when_waiting(waiting)
        decided = await toolset.wait_for_decisions(result.output, timeout=decision_timeout)
        tools = {call.tool_call_id: call.tool for call in waiting}
        for tool_call_id, value in [*decided.calls.items(), *decided.approvals.items()]:
            shown.told(tool_call_id, tools.get(tool_call_id), value)
        result = await agent.run(
            message_history=result.all_messages(), deferred_tool_results=decided
        )
    task = await toolset.task_for(result.conversation_id)
    calls = _calls_done(await task.status())
    report({"event": "onceflow", "task_id": task.task_id, "calls": calls})
    await toolset.close(result)
    report({"event": "final", "output": result.output, "task_id": task.task_id})
    return result.output


class LoseFirstAnswer(httpx.AsyncBaseTransport):
    """Delivers every request but loses onceflow's answer to the first call of ``tool``,
    as a network timing out on the way back: onceflow did the work, the agent never
    heard. The client asks again with the call's key and gets the same call's answer."""

    def __init__(self, tool: str, report: Report) -> None:
        self._real = httpx.AsyncHTTPTransport()
        self._tool, self._report = tool, report
        self._lost = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._real.handle_async_request(request)
        if self._lost or not request.url.path.endswith("/calls"):
            return response
        if json.loads(request.content or b"{}").get("tool") != self._tool:
            return response
        self._lost = True
        await response.aread()
        self._report({"event": "lost", "tool": self._tool})
        raise httpx.ReadTimeout("the answer was lost on the way back", request=request)

    async def aclose(self) -> None:
        await self._real.aclose()


def describe(event: Event) -> str:
    """One event as a line (or a few) for people."""
    kind = event["event"]
    if kind == "asked":
        arguments = json.dumps(event["arguments"], sort_keys=True)
        return f"model asked    {event['tool']} {arguments}  [call {event['tool_call_id']}]"
    if kind == "told":
        content = event["content"]
        shown = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
        note = "" if event["outcome"] == "success" else f" ({event['outcome']})"
        return f"model told     [call {event['tool_call_id']}]{note} {shown}"
    if kind == "lost":
        return (
            f"network        onceflow's answer to {event['tool']} was lost on the way back; "
            "the client asks again with the same key"
        )
    if kind == "waiting":
        how = event.get("reconcile_command") or event.get("approve_command") or ""
        line = (
            f"waiting        {event['tool']} [call {event['tool_call_id']}] is {event['state']}: "
            f"{event.get('reason') or ''}"
        )
        return f"{line}\n               a person decides: {how}" if how else line
    if kind == "onceflow":
        return "\n".join(
            ["onceflow did   (task " + event["task_id"] + ")"]
            + [f"               {call['summary']}" for call in event["calls"]]
        )
    if kind == "final":
        return f"final answer   {event['output']}"
    return json.dumps(event, sort_keys=True)


def main(argv: list[str] | None = None) -> None:
    """``python -m support_agent``: handle one order, printing what happens."""
    parser = argparse.ArgumentParser(prog="python -m support_agent", description=__doc__)
    parser.add_argument(
        "--gateway", default=os.environ.get("ONCEFLOW_GATEWAY_URL", "http://127.0.0.1:8080")
    )
    parser.add_argument("--api-key", default=os.environ.get("ONCEFLOW_API_KEY"))
    parser.add_argument("--order", required=True, help="The order the customer writes about.")
    parser.add_argument(
        "--model",
        default=os.environ.get("SUPPORT_AGENT_MODEL") or None,
        help="A PydanticAI model name (e.g. openai:gpt-4o, with its API key in the "
        "environment); default the scripted offline model.",
    )
    parser.add_argument(
        "--lose-answer",
        default=None,
        help="Lose onceflow's first answer to this tool's call (default: send_email with "
        "the scripted model, none with a real one; 'none' for none).",
    )
    parser.add_argument("--decision-timeout", type=float, default=3600.0)
    parser.add_argument("--json", action="store_true", help="One JSON event per line.")
    args = parser.parse_args(argv)
    if not args.api_key:
        parser.error("--api-key (or ONCEFLOW_API_KEY) is needed")
    lose = args.lose_answer or (None if args.model else "send_email")

    def report(event: Event) -> None:
        print(json.dumps(event, default=str) if args.json else describe(event), flush=True)

    async def handle() -> None:
        transport = LoseFirstAnswer(lose, report) if lose and lose != "none" else None
        async with OnceflowClient(args.gateway, api_key=args.api_key, transport=transport) as of:
            await run_support_agent(
                of,
                args.order,
                model=args.model,
                report=report,
                decision_timeout=args.decision_timeout,
            )

    try:
        asyncio.run(handle())
    except KeyboardInterrupt:
        sys.exit(130)


class _Shown:
    """Reports each tool call as the run makes it, and each answer once."""

    def __init__(self, report: Report) -> None:
        self._report = report
        self._seen: set[tuple[str, str]] = set()

    def asked(self, tool_call_id: str, tool: str, arguments: dict[str, Any]) -> None:
        if self._first("asked", tool_call_id):
            self._report(
                {
                    "event": "asked",
                    "tool": tool,
                    "tool_call_id": tool_call_id,
                    "arguments": arguments,
                }
            )

    def told(self, tool_call_id: str, tool: str | None, value: Any) -> None:
        """What the model is told about a call: its result, a retry, failure or denial."""
        if isinstance(value, ToolApproved):
            return  # the resumed run calls the tool, which reports what it is told
        if isinstance(value, ToolDenied):
            self._told(tool_call_id, tool, "denied", value.message)
        elif isinstance(value, ModelRetry | ToolFailed):
            outcome = "retried" if isinstance(value, ModelRetry) else "failed"
            self._told(tool_call_id, tool, outcome, value.message)
        else:
            self._told(tool_call_id, tool, "success", value)

    def _told(self, tool_call_id: str, tool: str | None, outcome: str, content: Any) -> None:
        if not self._first("told", tool_call_id):
            return
        self._report(
            {
                "event": "told",
                "tool": tool,
                "tool_call_id": tool_call_id,
                "outcome": outcome,
                "content": content,
                "repeat": isinstance(content, str) and content.startswith(ALREADY_DONE),
            }
        )

    def _first(self, kind: str, tool_call_id: str) -> bool:
        if (kind, tool_call_id) in self._seen:
            return False
        self._seen.add((kind, tool_call_id))
        return True


@dataclass
class _Reporting(WrapperToolset[None]):
    """The onceflow toolset, reporting each call and what the model is told as it
    happens (a deferred call is reported as waiting once the run stops)."""

    shown: _Shown

    async def call_tool(
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[None],
        tool: ToolsetTool[None],
    ) -> Any:
        tool_call_id = ctx.tool_call_id or ""
        self.shown.asked(tool_call_id, name, tool_args)
        try:
            told = await self.wrapped.call_tool(name, tool_args, ctx, tool)
        except (ModelRetry, ToolFailed) as failure:
            self.shown.told(tool_call_id, name, failure)
            raise
        self.shown.told(tool_call_id, name, told)
        return told


def _waiting_event(call: WaitingCall) -> Event:
    event: Event = {
        "tool": call.tool,
        "tool_call_id": call.tool_call_id,
        "task_id": call.task_id,
        "step_id": call.step_id,
        "state": call.state,
        "reason": call.reason,
        "needs_person": call.needs_person,
        "reconcile_command": call.reconcile_command,
    }
    if call.state == "awaiting_approval":
        event["approve_command"] = (
            f"onceflow approve {call.task_id} --step {call.step_id} --approve|--deny --reason TEXT"
        )
    return event


def _calls_done(status: dict[str, Any]) -> list[Event]:
    """Each call of the task as onceflow ran it."""
    calls = []
    for step in status.get("steps", []):
        attempts = [str(attempt.get("outcome")) for attempt in step.get("attempts", [])]
        decided = [
            f"{decision['decision']} by {decision['operator']}"
            for decision in status.get("decisions", [])
            if decision.get("step_id") == step["step_id"] and decision.get("accepted", True)
        ]
        if step.get("repeat_of"):
            did = f"answered by the repeat guard from {step['repeat_of']}: nothing ran"
        else:
            did = f"attempts: {', '.join(attempts) or 'none'}"
            if decided:
                did += f"; decided: {', '.join(decided)}"
        calls.append(
            {
                "step_id": step["step_id"],
                "tool": step["tool"],
                "state": step["state"],
                "attempts": attempts,
                "repeat_of": step.get("repeat_of"),
                "resource_id": step.get("resource_id"),
                "summary": f"{step['step_id']:<13} {step['tool']:<15} {step['state']:<10} {did}",
            }
        )
    return calls


def _tool_returns(messages: list[ModelMessage]) -> dict[str, ToolReturnPart]:
    return {
        part.tool_call_id: part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


def _order_id(messages: list[ModelMessage]) -> str:
    for message in messages:
        for part in message.parts:
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                found = re.search(r"order (\S+) arrived", part.content)
                if found:
                    return found.group(1)
    raise ValueError("the customer named no order")


def _calls(*calls: tuple[str, dict[str, Any], str]) -> ModelResponse:
    return ModelResponse(
        parts=[
            ToolCallPart(tool_name=tool, args=arguments, tool_call_id=tool_call_id)
            for tool, arguments, tool_call_id in calls
        ]
    )


if __name__ == "__main__":
    main()
