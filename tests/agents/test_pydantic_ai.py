"""PydanticAI drives onceflow through ``onceflow_client.pydantic_ai.OnceflowToolset``.

A scripted ``FunctionModel`` plays the LLM, turn by turn, against the real stack of
``conftest``: a gateway process over HTTP, an in-process worker, the Temporal dev server,
PostgreSQL, the local Stripe-compatible provider and an SMTP sink behind an outbox
relay. Effects are counted where they land (the provider's ledger, the messages the
sink applied) and tasks in Temporal's visibility.
"""

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from onceflow_client import OnceflowClient
from onceflow_client.pydantic_ai import OnceflowToolset, waiting_calls
from onceflow_devstack.stripe_provider import Fault, ProviderControl
from pydantic_ai import (
    Agent,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RunUsage

from tests.gateway.conftest import Caller
from tests.harness import HANG_SECONDS

from .conftest import (
    AGENT_TOOLS,
    FAST_BUDGET,
    AgentStack,
    new_order_id,
    new_recipient,
)

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

ORDER = {
    "customer_id": "c-pydantic-ai",
    "currency": "usd",
    "lines": [{"sku": "mug", "quantity": 2, "unit_price_cents": 1250}],
}


def charge(order_id: str, amount: int = 2500) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "usd",
        "customer": "cus_bob",
        "payment_method": "pm_card_visa",
        "order_id": order_id,
    }


def email(recipient: str, subject: str = "Your refund") -> dict[str, Any]:
    return {"to": [recipient], "subject": subject, "body": "We refunded your order."}


# ── the scripted model ────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Seen:
    """What the model has been told so far, by tool-call id."""

    returns: dict[str, ToolReturnPart]

    def content(self, tool_call_id: str) -> Any:
        return self.returns[tool_call_id].content


Turn = Callable[[Seen], Sequence[ToolCallPart] | str]


class ScriptedModel:
    """The LLM, played turn by turn: the n-th answer is ``turns[n](what it has seen)``.

    Turns are counted from the conversation's history, so a run resumed with deferred
    results carries on where the paused one stopped.
    """

    def __init__(self, *turns: Turn) -> None:
        self.turns = turns
        self.tools_offered: list[Any] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.tools_offered = list(info.function_tools)
        returns = {
            part.tool_call_id: part
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        }
        turn = self.turns[sum(isinstance(message, ModelResponse) for message in messages)]
        said = turn(Seen(returns))
        if isinstance(said, str):
            return ModelResponse(parts=[TextPart(said)])
        return ModelResponse(parts=list(said))


def call(tool: str, arguments: dict[str, Any], tool_call_id: str) -> ToolCallPart:
    return ToolCallPart(tool_name=tool, args=arguments, tool_call_id=tool_call_id)


def agent_for(model: ScriptedModel, toolset: OnceflowToolset[None]) -> Agent[None, Any]:
    return Agent(FunctionModel(model), toolsets=[toolset], output_type=[str, DeferredToolRequests])


def tool_returns(messages: list[ModelMessage]) -> dict[str, ToolReturnPart]:
    return {
        part.tool_call_id: part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


class LoseCallAnswers(httpx.AsyncBaseTransport):
    """Delivers every request, but loses the answers to the first ``count`` requests for
    ``tool``'s calls, like a network timing out on the way back."""

    def __init__(self, tool: str, count: int) -> None:
        self._real = httpx.AsyncHTTPTransport()
        self._tool, self._left = tool, count
        self.sent = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        is_call = request.url.path.endswith("/calls") and (
            json.loads(request.content or b"{}").get("tool") == self._tool
        )
        self.sent += is_call
        response = await self._real.handle_async_request(request)
        if is_call and self._left > 0:
            self._left -= 1
            await response.aread()
            raise httpx.ReadTimeout("answer lost", request=request)
        return response

    async def aclose(self) -> None:
        await self._real.aclose()


@pytest.fixture
async def agent(agent_stack: AgentStack) -> Caller:
    """The agent's principal, in a tenant of its own."""
    return await agent_stack.agent()


@pytest.fixture
async def onceflow(agent_stack: AgentStack, agent: Caller) -> AsyncIterator[OnceflowClient]:
    """The agent's client of the gateway."""
    async with OnceflowClient(agent_stack.gateway_url, api_key=agent.api_key) as client:
        yield client


# ── the tests ─────────────────────────────────────────────────────────────────────────


async def test_a_run_of_five_tool_calls_is_one_open_task_with_one_effect_each(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient
) -> None:
    order_id, recipient = new_order_id(), new_recipient()
    model = ScriptedModel(
        lambda seen: [call("create_order", ORDER, "order")],
        lambda seen: [call("charge_payment", charge(order_id), "pay")],
        lambda seen: [call("refund_payment", {"charge_step": "pay", "amount": 500}, "refund")],
        # Two at once: PydanticAI runs them concurrently, in the same task.
        lambda seen: [
            call("send_email", email(recipient), "mail"),
            call("issue_coupon", {"user_id": order_id, "coupon_id": "SORRY5"}, "coupon"),
        ],
        lambda seen: f"Refunded {seen.content('refund')['amount']} and wrote to {recipient}.",
    )
    toolset = await OnceflowToolset[None].from_gateway(onceflow, tools=AGENT_TOOLS)

    result = await agent_for(model, toolset).run("Refund part of the order and apologise.")
    status = await (await toolset.task_for(result.conversation_id)).status()
    closed = await toolset.close(result)

    assert result.output == f"Refunded 500 and wrote to {recipient}."
    assert sorted(step["step_id"] for step in status["steps"]) == sorted(
        ["order", "pay", "refund", "mail", "coupon"]
    )
    assert all(step["state"] == "succeeded" for step in status["steps"])
    assert closed is not None and closed["closing"] == "closed by the agent"
    # Each tool as the gateway describes it: its contract's description and JSON schema.
    catalogue = {tool["name"]: tool for tool in await onceflow.list_tools()}
    offered = {tool.name: tool for tool in model.tools_offered}
    assert set(offered) == set(AGENT_TOOLS)
    for name, tool in offered.items():
        assert tool.description == catalogue[name]["description"]
        assert tool.parameters_json_schema == catalogue[name]["input_schema"]

    far = agent_stack.far_sides
    [charged] = await far.charges(order_id)
    assert [refund.amount for refund in await far.refunds(charged.object_id)] == [500]
    assert len(await agent_stack.delivered(recipient)) == 1
    assert await agent_stack.task_workflows(agent) == 1


async def test_a_model_that_calls_the_same_refund_twice_refunds_once(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient
) -> None:
    order_id = new_order_id()
    refund = {"charge_step": "pay", "amount": 300}
    model = ScriptedModel(
        lambda seen: [call("charge_payment", charge(order_id), "pay")],
        lambda seen: [call("refund_payment", refund, "refund-1")],
        # The model lost track of the answer and asks for the same refund again.
        lambda seen: [call("refund_payment", refund, "refund-2")],
        lambda seen: "Refunded once.",
    )
    # onceflow's first answer to the refund is lost on its way back too: the client
    # asks again with the call's key, and the gateway answers the same call.
    lossy = LoseCallAnswers("refund_payment", count=1)
    async with OnceflowClient(
        agent_stack.gateway_url,
        api_key=agent.api_key,
        transport=lossy,
    ) as client:
        toolset = await OnceflowToolset[None].from_gateway(client, tools=AGENT_TOOLS)
        result = await agent_for(model, toolset).run("Refund 3.00 of the order.")
        status = await (await toolset.task_for(result.conversation_id)).status()
        await toolset.close(result)

    told = tool_returns(result.all_messages())
    first, second = told["refund-1"].content, told["refund-2"].content
    assert isinstance(first, dict) and first["amount"] == 300
    assert second == "already done: " + json.dumps(first, sort_keys=True)
    steps = {step["step_id"]: step for step in status["steps"]}
    assert steps["refund-2"]["repeat_of"] == "refund-1"
    assert not steps["refund-2"]["attempts"], "the repeat never ran"
    assert lossy.sent == 3, "the lost answer was asked for again, then the repeat"

    [charged] = await agent_stack.far_sides.charges(order_id)
    assert [r.object_id for r in await agent_stack.far_sides.refunds(charged.object_id)] == [
        steps["refund-1"]["resource_id"]
    ]
    assert await agent_stack.task_workflows(agent) == 1


async def test_a_framework_that_runs_the_same_tool_call_again_gets_the_same_call(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient
) -> None:
    order_id = new_order_id()
    toolset = await OnceflowToolset[None].from_gateway(onceflow, tools=["charge_payment"])
    # What a durable runner replaying the step, or a framework retrying it, does: the same
    # tool call (conversation and tool-call id) reaches the toolset twice.
    ctx = RunContext[None](
        deps=None,
        model=FunctionModel(ScriptedModel()),
        usage=RunUsage(),
        conversation_id=f"conversation-{order_id}",
        tool_call_id="call_pay_1",
    )
    tool = (await toolset.get_tools(ctx))["charge_payment"]

    first = await toolset.call_tool("charge_payment", charge(order_id), ctx, tool)
    again = await toolset.call_tool("charge_payment", charge(order_id), ctx, tool)
    status = await (await toolset.task_for(ctx.conversation_id or "")).status()
    await toolset.close(ctx.conversation_id or "")

    assert again == first, "the same call's answer, not an 'already done' repeat"
    assert [step["step_id"] for step in status["steps"]] == ["call_pay_1"]
    assert [c.object_id for c in await agent_stack.far_sides.charges(order_id)] == [
        first["payment_intent"]
    ]


async def test_a_parked_refund_ends_the_run_deferred_and_the_operator_resumes_it(
    agent_stack: AgentStack,
    agent: Caller,
    onceflow: OnceflowClient,
    behaving_provider: ProviderControl,
) -> None:
    order_id, recipient = new_order_id(), new_recipient()
    refund = {"charge_step": "pay", "amount": 400}
    model = ScriptedModel(
        lambda seen: [call("charge_payment", charge(order_id), "pay")],
        lambda seen: [call("refund_payment", refund, "refund")],
        # Resumed with the person's decision: the model asks for the refund once more...
        lambda seen: [call("refund_payment", refund, "refund-again")],
        lambda seen: [call("send_email", email(recipient), "mail")],
        lambda seen: f"Refund {seen.content('refund')['refund']} done, customer told.",
    )
    toolset = await OnceflowToolset[None].from_gateway(
        onceflow, tools=AGENT_TOOLS, budget=FAST_BUDGET
    )
    pydantic_agent = agent_for(model, toolset)
    # Stripe refunds, answers 500 and keeps that answer under the key, and its refunds
    # cannot be read back: no repeat and no look-up can learn what happened, so it parks.
    await behaving_provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds")
    await behaving_provider.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/refunds", times=None
    )

    paused = await pydantic_agent.run("Refund 4.00 of the order and tell the customer.")

    assert isinstance(paused.output, DeferredToolRequests)
    # An operator's reconciliation, not an approval the app could give.
    assert [part.tool_call_id for part in paused.output.calls] == ["refund"]
    assert paused.output.approvals == []
    [waiting] = waiting_calls(paused.output)
    assert (waiting.tool_call_id, waiting.tool, waiting.step_id) == (
        "refund",
        "refund_payment",
        "refund",
    )
    assert waiting.state == "parked" and waiting.needs_person
    assert waiting.reconcile_command and "onceflow reconcile" in waiting.reconcile_command
    assert "refund" not in tool_returns(paused.all_messages()), "the model was told nothing"
    [charged] = await agent_stack.far_sides.charges(order_id)
    [refunded] = await agent_stack.far_sides.refunds(charged.object_id)
    await behaving_provider.clear_faults()  # the reads are back for the operator's check

    operator = await agent_stack.operator(agent)
    await agent_stack.reconcile(
        operator,
        waiting.task_id,
        waiting.step_id,
        decision="happened",
        resource_id=refunded.object_id,
        reason="the refund is in the Stripe dashboard",
    )
    decided = await toolset.wait_for_decisions(paused.output, timeout=HANG_SECONDS)
    resumed = await pydantic_agent.run(
        message_history=paused.all_messages(), deferred_tool_results=decided
    )
    await toolset.close(resumed)

    assert resumed.output == f"Refund {refunded.object_id} done, customer told."
    told = tool_returns(resumed.all_messages())
    assert told["refund"].content["refund"] == refunded.object_id
    assert str(told["refund-again"].content).startswith("already done: ")
    assert len(await agent_stack.far_sides.refunds(charged.object_id)) == 1
    assert len(await agent_stack.delivered(recipient)) == 1
    assert await agent_stack.task_workflows(agent) == 1


async def test_invalid_arguments_go_back_to_the_model_which_corrects_them(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient
) -> None:
    recipient = new_recipient()
    model = ScriptedModel(
        lambda seen: [call("send_email", {**email(recipient), "to": ["not an address"]}, "m1")],
        lambda seen: [call("send_email", email(recipient), "m2")],
        lambda seen: "Sent.",
    )
    toolset = await OnceflowToolset[None].from_gateway(onceflow, tools=["send_email"])

    result = await agent_for(model, toolset).run("Write to the customer.")
    status = await (await toolset.task_for(result.conversation_id)).status()
    await toolset.close(result)

    told = tool_returns(result.all_messages())
    assert told["m1"].outcome == "retried"
    assert "invalid arguments, nothing was done" in str(told["m1"].content)
    assert told["m2"].outcome == "success"
    assert [step["step_id"] for step in status["steps"]] == ["m2"], "the bad call left nothing"
    assert len(await agent_stack.delivered(recipient)) == 1


async def test_a_refund_awaiting_approval_defers_and_a_denial_is_told_not_retried(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient
) -> None:
    order_id = new_order_id()
    model = ScriptedModel(
        lambda seen: [call("charge_payment", charge(order_id), "pay")],
        # No amount: a full refund, which always waits for a person.
        lambda seen: [call("refund_payment", {"charge_step": "pay"}, "full-refund")],
        lambda seen: "The refund was not approved.",
    )
    toolset = await OnceflowToolset[None].from_gateway(onceflow, tools=AGENT_TOOLS)
    pydantic_agent = agent_for(model, toolset)

    paused = await pydantic_agent.run("Refund the whole order.")

    assert isinstance(paused.output, DeferredToolRequests)
    assert [part.tool_call_id for part in paused.output.approvals] == ["full-refund"]
    assert paused.output.calls == []
    [waiting] = waiting_calls(paused.output)
    assert waiting.state == "awaiting_approval" and waiting.arguments_digest
    operator = await agent_stack.operator(agent)
    await agent_stack.approve(
        operator,
        waiting.task_id,
        waiting.step_id,
        approved=False,
        reason="over the goodwill limit",
        arguments_digest=waiting.arguments_digest,
    )
    decided = await toolset.wait_for_decisions(paused.output, timeout=HANG_SECONDS)
    resumed = await pydantic_agent.run(
        message_history=paused.all_messages(), deferred_tool_results=decided
    )
    await toolset.close(resumed)

    told = tool_returns(resumed.all_messages())["full-refund"]
    assert told.outcome == "denied"
    assert "denied by a person: " in str(told.content) and "over the goodwill limit" in str(
        told.content
    )
    assert resumed.output == "The refund was not approved."
    [charged] = await agent_stack.far_sides.charges(order_id)
    assert await agent_stack.far_sides.refunds(charged.object_id) == []


@pytest.mark.parametrize("approved", [True, False], ids=["ToolApproved", "ToolDenied"])
async def test_an_approval_screen_answers_a_refund_with_pydantic_ais_own_objects(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient, approved: bool
) -> None:
    order_id = new_order_id()
    model = ScriptedModel(
        lambda seen: [call("charge_payment", charge(order_id), "pay")],
        lambda seen: [call("refund_payment", {"charge_step": "pay"}, "full-refund")],
        lambda seen: f"Told: {seen.content('full-refund')}",
    )
    approver = await agent_stack.approver(agent)
    async with OnceflowClient(agent_stack.gateway_url, api_key=approver.api_key) as screen:
        toolset = await OnceflowToolset[None].from_gateway(
            onceflow, tools=AGENT_TOOLS, approver=screen
        )
        pydantic_agent = agent_for(model, toolset)
        paused = await pydantic_agent.run("Refund the whole order.")

        assert isinstance(paused.output, DeferredToolRequests)
        [asked] = paused.output.approvals
        assert (asked.tool_name, asked.tool_call_id, paused.output.calls) == (
            "refund_payment",
            "full-refund",
            [],
        )
        answer = ToolApproved() if approved else ToolDenied("refund the shipping only")
        answers = DeferredToolResults(approvals={asked.tool_call_id: answer})
        decided = await toolset.wait_for_decisions(paused.output, answers)
        resumed = await pydantic_agent.run(
            message_history=paused.all_messages(), deferred_tool_results=decided
        )
        status = await (await toolset.task_for(resumed.conversation_id)).status()
        await toolset.close(resumed)

    told = tool_returns(resumed.all_messages())["full-refund"]
    [charged] = await agent_stack.far_sides.charges(order_id)
    refunds = await agent_stack.far_sides.refunds(charged.object_id)
    [decision] = status["decisions"]
    assert (decision["step_id"], decision["operator"]) == ("full-refund", "refund-desk")
    [refund_step] = [step for step in status["steps"] if step["step_id"] == "full-refund"]
    if approved:
        assert told.outcome == "success"
        assert [refund.object_id for refund in refunds] == [told.content["refund"]]
        assert (decision["decision"], refund_step["state"]) == ("approve", "succeeded")
    else:
        assert (told.outcome, told.content) == ("denied", "refund the shipping only")
        assert refunds == []
        assert (decision["decision"], decision["reason"]) == ("deny", "refund the shipping only")
        assert refund_step["state"] == "denied"
    assert resumed.output == f"Told: {told.content}"


async def test_an_answer_that_never_arrives_defers_the_call_instead_of_inviting_a_retry(
    agent_stack: AgentStack, agent: Caller, onceflow: OnceflowClient
) -> None:
    recipient = new_recipient()
    model = ScriptedModel(
        lambda seen: [call("send_email", email(recipient), "mail")],
        lambda seen: "Sent.",
    )
    # The first send and both of the client's resends lose their answers.
    lossy = LoseCallAnswers("send_email", count=3)
    async with OnceflowClient(
        agent_stack.gateway_url,
        api_key=agent.api_key,
        transport=lossy,
    ) as client:
        toolset = await OnceflowToolset[None].from_gateway(client, tools=["send_email"])
        pydantic_agent = agent_for(model, toolset)
        paused = await pydantic_agent.run("Write to the customer.")

        assert isinstance(paused.output, DeferredToolRequests)
        [waiting] = waiting_calls(paused.output)
        assert waiting.state == "unanswered" and not waiting.needs_person
        assert "mail" not in tool_returns(paused.all_messages()), "no 'try again' for the model"

        decided = await toolset.wait_for_decisions(paused.output, timeout=HANG_SECONDS)
        resumed = await pydantic_agent.run(
            message_history=paused.all_messages(), deferred_tool_results=decided
        )
        status = await (await toolset.task_for(resumed.conversation_id)).status()
        await toolset.close(resumed)

    assert resumed.output == "Sent."
    assert lossy.sent == 4, "three lost answers, then the same call asked once more"
    assert [step["step_id"] for step in status["steps"]] == ["mail"]
    assert len(await agent_stack.delivered(recipient)) == 1
