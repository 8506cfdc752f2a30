"""The OpenAI Agents SDK drives onceflow through ``onceflow_client.openai_agents``.

A scripted ``Model`` plays the LLM (deterministic, no network: tracing is off and nothing
talks to OpenAI) against the real stack of ``conftest.agent_stack``: the Temporal dev
server, PostgreSQL, an in-process worker, a gateway process, the local Stripe-compatible
provider and an SMTP sink behind an outbox relay. Effects are counted where they land:
the provider's ledger and the messages the sink received. The last two tests need no
stack: a fake gateway whose answers never come.
"""

import asyncio
import inspect
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
from agents import (
    Agent,
    Model,
    ModelResponse,
    RunConfig,
    Runner,
    RunState,
    ToolApprovalItem,
    Usage,
    set_tracing_disabled,
)
from agents.testing import assistant_message, function_call
from onceflow_client import OnceflowClient
from onceflow_client.openai_agents import OnceflowRun
from onceflow_devstack.stripe_provider import Fault, ProviderControl

from tests.gateway.conftest import Caller
from tests.harness import HANG_SECONDS

from .conftest import AgentStack, new_order_id, new_recipient

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

TOOLS = ("issue_coupon", "create_order", "charge_payment", "refund_payment", "send_email")
NO_TRACES = RunConfig(tracing_disabled=True)
REPEAT_INVITATIONS = ("try again", "please retry", "an error occurred")


@pytest.fixture(scope="module", autouse=True)
def no_traces() -> Iterator[None]:
    """The SDK exports traces to OpenAI by default: not from these tests."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


@pytest.fixture
async def agent(agent_stack: AgentStack) -> Caller:
    """An agent of a fresh tenant (task ids include it), allowed the five tools."""
    return await agent_stack.agent(TOOLS)


@pytest.fixture
async def onceflow(agent_stack: AgentStack, agent: Caller) -> AsyncIterator[OnceflowClient]:
    async with OnceflowClient(agent_stack.gateway_url, api_key=agent.api_key) as client:
        yield client


# ── the scripted model ────────────────────────────────────────────────────────────────

Turn = Callable[["ScriptedModel"], list[Any]]


@dataclass
class ScriptedModel(Model):
    """An LLM played by a script: each model call takes the next turn, which may read the
    tool outputs the model has been shown so far."""

    turns: list[Turn]
    outputs: dict[str, str] = field(default_factory=dict)
    """Every tool output the model was shown, by tool-call id."""
    calls: int = 0

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        for item in input if isinstance(input, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                self.outputs[str(item["call_id"])] = str(item["output"])
        assert self.calls < len(self.turns), f"the script has no turn {self.calls + 1}"
        turn = self.turns[self.calls]
        self.calls += 1
        return ModelResponse(output=turn(self), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")

    def result_of(self, call_id: str) -> dict[str, Any]:
        """A tool output the model was shown, as the JSON result it is."""
        result: dict[str, Any] = json.loads(self.outputs[call_id])
        return result


def call(name: str, call_id: str, arguments: dict[str, Any]) -> Turn:
    return lambda model: [function_call(name, arguments, call_id=call_id)]


def calls(*made: tuple[str, str, dict[str, Any]]) -> Turn:
    """Several tool calls in one turn (the SDK runs them side by side)."""
    return lambda model: [function_call(name, args, call_id=cid) for name, cid, args in made]


def say(text: str) -> Turn:
    return lambda model: [assistant_message(text)]


def support_agent(model: ScriptedModel, run: OnceflowRun) -> Agent[Any]:
    return Agent(name="support", instructions="Help the customer.", model=model, tools=run.tools)


def charge(order_id: str, amount: int = 4200) -> dict[str, Any]:
    return {
        "amount": amount,
        "currency": "eur",
        "customer": "cus_alice",
        "payment_method": "pm_card_visa",
        "order_id": order_id,
    }


def email(to: str, subject: str) -> dict[str, Any]:
    return {"to": [to], "subject": subject, "body": "Your refund is on its way."}


def no_invitation_to_repeat(model: ScriptedModel) -> None:
    for call_id, output in model.outputs.items():
        assert not any(phrase in output.lower() for phrase in REPEAT_INVITATIONS), (call_id, output)


# ── on the stack ──────────────────────────────────────────────────────────────────────


async def test_a_run_of_five_tool_calls_is_one_open_task_with_one_effect_each(
    agent_stack: AgentStack, onceflow: OnceflowClient, agent: Caller
) -> None:
    order_id, customer = new_order_id(), new_recipient()
    order = {
        "customer_id": "cus_alice",
        "currency": "eur",
        "lines": [{"sku": "tee", "quantity": 1, "unit_price_cents": 4200}],
    }
    refund = {"charge_step": "c-charge", "amount": 1200, "reason": "requested_by_customer"}
    coupon = {"user_id": f"u-{uuid.uuid4().hex[:8]}", "coupon_id": "SORRY10"}
    model = ScriptedModel(
        [
            call("issue_coupon", "c-coupon", coupon),
            call("create_order", "c-order", order),
            call("charge_payment", "c-charge", charge(order_id)),
            call("refund_payment", "c-refund", refund),
            call("send_email", "c-email", email(customer, "Your refund")),
            say("Refunded 12.00 EUR, gave a coupon and told the customer."),
        ]
    )

    async with OnceflowRun(onceflow, tools=TOOLS, idle_timeout=timedelta(minutes=5)) as run:
        result = await Runner.run(
            support_agent(model, run), "Refund 12 EUR and apologise.", run_config=NO_TRACES
        )
        during = await onceflow.status(run.task_id)
    closed = await onceflow.status(run.task_id)

    assert result.final_output == "Refunded 12.00 EUR, gave a coupon and told the customer."
    assert result.interruptions == []
    assert [(step["step_id"], step["state"]) for step in during["steps"]] == [
        ("c-coupon", "succeeded"),
        ("c-order", "succeeded"),
        ("c-charge", "succeeded"),
        ("c-refund", "succeeded"),
        ("c-email", "succeeded"),
    ]
    assert closed["closing"] == "closed by the agent"
    assert await agent_stack.task_workflows(agent) == 1
    no_invitation_to_repeat(model)

    far_sides = agent_stack.far_sides
    payment_intent = model.result_of("c-charge")["payment_intent"]
    assert [entry.object_id for entry in await far_sides.charges(order_id)] == [payment_intent]
    [refunded] = await far_sides.refunds(payment_intent)
    assert (refunded.object_id, refunded.amount) == (model.result_of("c-refund")["refund"], 1200)
    # send_email succeeds once the relay delivered: nothing is left to arrive.
    [message] = far_sides.emails(customer)
    assert message.message_id == model.result_of("c-email")["message_id"]
    assert far_sides.sink.sink.deliveries(message.message_id) == 1


async def test_a_model_that_asks_for_the_same_refund_again_refunds_once(
    agent_stack: AgentStack, onceflow: OnceflowClient
) -> None:
    refund = {"charge_step": "c-charge", "amount": 900, "reason": "requested_by_customer"}
    model = ScriptedModel(
        [
            call("charge_payment", "c-charge", charge(new_order_id())),
            # The same refund twice in one turn (the SDK runs them side by side)...
            calls(
                ("refund_payment", "c-refund-1", refund),
                ("refund_payment", "c-refund-2", refund),
            ),
            # ...and once more, later, as a model that lost track does.
            call("refund_payment", "c-refund-3", refund),
            say("Refunded 9.00 EUR."),
        ]
    )

    async with OnceflowRun(onceflow, tools=TOOLS) as run:
        result = await Runner.run(support_agent(model, run), "Refund 9 EUR.", run_config=NO_TRACES)
        status = await onceflow.status(run.task_id)

    assert result.final_output == "Refunded 9.00 EUR."
    refund_ids = ("c-refund-1", "c-refund-2", "c-refund-3")
    outputs = [model.outputs[call_id] for call_id in refund_ids]
    [first] = [output for output in outputs if not output.startswith("already done: ")]
    repeats = [output.removeprefix("already done: ") for output in outputs if output != first]
    assert [json.loads(repeat) for repeat in repeats] == [json.loads(first)] * 2
    first_id = refund_ids[outputs.index(first)]
    repeat_of = {step["step_id"]: step["repeat_of"] for step in status["steps"]}
    assert repeat_of == {
        "c-charge": None,
        **{call_id: None if call_id == first_id else first_id for call_id in refund_ids},
    }
    no_invitation_to_repeat(model)
    payment_intent = model.result_of("c-charge")["payment_intent"]
    [refunded] = await agent_stack.far_sides.refunds(payment_intent)
    assert refunded.object_id == json.loads(first)["refund"]


async def test_a_parked_refund_pauses_the_run_until_the_operator_reconciles_it(
    agent_stack: AgentStack,
    onceflow: OnceflowClient,
    agent: Caller,
    behaving_provider: ProviderControl,
) -> None:
    far_sides, customer = agent_stack.far_sides, new_recipient()
    refund = {"charge_step": "c-charge", "amount": 700, "reason": "requested_by_customer"}
    model = ScriptedModel(
        [
            call("charge_payment", "c-charge", charge(new_order_id())),
            call("refund_payment", "c-refund", refund),
            # Only once the run resumes with the refund's decided outcome:
            call("send_email", "c-email", email(customer, "Your refund")),
            say("Refunded 7.00 EUR and told the customer."),
        ]
    )
    # The provider refunds, then answers 500 (and keeps that 500 under the key), and its
    # refunds cannot be read back: nothing can tell onceflow whether it happened.
    await behaving_provider.add_fault(Fault.ERROR_500_AFTER_COMMIT, path_prefix="/v1/refunds")
    await behaving_provider.add_fault(
        Fault.ERROR_503, method="GET", path_prefix="/v1/refunds", times=None
    )
    run = OnceflowRun(onceflow, tools=TOOLS)
    await run.load()
    paused = await Runner.run(
        support_agent(model, run), "Refund 7 EUR, then tell the customer.", run_config=NO_TRACES
    )

    [interruption] = paused.interruptions
    assert isinstance(interruption, ToolApprovalItem)
    assert (interruption.name, interruption.call_id) == ("refund_payment", "c-refund")
    assert paused.final_output is None
    assert model.calls == 2 and "c-refund" not in model.outputs, "the model heard nothing yet"
    [waiting] = run.waiting_calls(paused.interruptions)
    assert (waiting.state, waiting.step_id, waiting.task_id) == ("parked", "c-refund", run.task_id)
    payment_intent = model.result_of("c-charge")["payment_intent"]
    [refunded] = await far_sides.refunds(payment_intent)
    await behaving_provider.clear_faults()  # the reads are back for the operator's check

    # Whether a parked refund happened is not the app's to decide: no rejection of it.
    assert run.approvals(paused.interruptions) == []
    rejected = paused.to_state()
    rejected.reject(interruption)
    with pytest.raises(ValueError, match="parked, not awaiting approval"):
        await run.wait_for_decisions(rejected, timeout=HANG_SECONDS)
    # The paused run is saved and its process goes away while a person looks.
    saved = paused.to_state().to_string()
    operator = await agent_stack.operator(agent)
    await agent_stack.reconcile(
        operator,
        run.task_id,
        waiting.step_id,
        decision="happened",
        resource_id=refunded.object_id,
        reason="the refund is in the provider's dashboard",
    )

    # Another process resumes the run: the same run id finds the same task and call.
    async with OnceflowRun(onceflow, tools=TOOLS, run_id=run.run_id) as resumed:
        assert resumed.task_id == run.task_id
        agent_again = support_agent(model, resumed)
        state = await RunState.from_string(agent_again, saved)
        [decided] = await resumed.wait_for_decisions(state, timeout=HANG_SECONDS)
        finished = await Runner.run(agent_again, state, run_config=NO_TRACES)
        status = await onceflow.status(resumed.task_id)

    assert decided.succeeded and decided.resource_id == refunded.object_id
    assert finished.final_output == "Refunded 7.00 EUR and told the customer."
    assert finished.interruptions == []
    assert model.result_of("c-refund")["refund"] == refunded.object_id
    no_invitation_to_repeat(model)
    assert [(step["step_id"], step["state"]) for step in status["steps"]] == [
        ("c-charge", "succeeded"),
        ("c-refund", "succeeded"),
        ("c-email", "succeeded"),
    ]
    assert await agent_stack.task_workflows(agent) == 1
    assert [entry.object_id for entry in await far_sides.refunds(payment_intent)] == [
        refunded.object_id
    ]
    [message] = far_sides.emails(customer)
    assert message.message_id == model.result_of("c-email")["message_id"]
    assert far_sides.sink.sink.deliveries(message.message_id) == 1


async def test_a_refund_awaiting_approval_pauses_the_run_and_a_denial_reaches_the_model(
    agent_stack: AgentStack, onceflow: OnceflowClient, agent: Caller
) -> None:
    model = ScriptedModel(
        [
            call("charge_payment", "c-charge", charge(new_order_id())),
            call("refund_payment", "c-refund", {"charge_step": "c-charge"}),  # in full
            say("The refund was declined."),
        ]
    )

    async with OnceflowRun(onceflow, tools=TOOLS) as run:
        support = support_agent(model, run)
        paused = await Runner.run(support, "Refund everything.", run_config=NO_TRACES)
        [waiting] = run.waiting_calls(paused.interruptions)
        assert waiting.state == "awaiting_approval"
        await agent_stack.approve(
            await agent_stack.operator(agent),
            run.task_id,
            waiting.step_id,
            approved=False,
            reason="refund the shipping only",
            arguments_digest=waiting.body["arguments_digest"],
        )
        state = paused.to_state()
        [decided] = await run.wait_for_decisions(state, timeout=HANG_SECONDS)
        finished = await Runner.run(support, state, run_config=NO_TRACES)

    assert decided.state == "denied"
    assert finished.final_output == "The refund was declined."
    assert model.outputs["c-refund"].startswith("denied: a person did not approve this call")
    no_invitation_to_repeat(model)
    payment_intent = model.result_of("c-charge")["payment_intent"]
    assert await agent_stack.far_sides.refunds(payment_intent) == []


@pytest.mark.parametrize("handed_over", [True, False], ids=["wait_for_decisions", "resumed"])
async def test_the_apps_state_approve_approves_a_refund_at_onceflow(
    agent_stack: AgentStack, onceflow: OnceflowClient, agent: Caller, handed_over: bool
) -> None:
    model = ScriptedModel(
        [
            call("charge_payment", "c-charge", charge(new_order_id())),
            call("refund_payment", "c-refund", {"charge_step": "c-charge"}),  # in full
            say("Refunded in full."),
        ]
    )
    approver = await agent_stack.approver(agent)
    async with (
        OnceflowClient(agent_stack.gateway_url, api_key=approver.api_key) as screen,
        OnceflowRun(onceflow, tools=TOOLS, approver=screen) as run,
    ):
        support = support_agent(model, run)
        paused = await Runner.run(support, "Refund everything.", run_config=NO_TRACES)
        [item] = run.approvals(paused.interruptions)
        assert (item.name, item.call_id) == ("refund_payment", "c-refund")
        state = paused.to_state()
        state.approve(item)
        if handed_over:
            [decided] = await run.wait_for_decisions(state, timeout=HANG_SECONDS)
            assert decided.succeeded
        finished = await Runner.run(support, state, run_config=NO_TRACES)
        status = await onceflow.status(run.task_id)

    assert finished.final_output == "Refunded in full."
    no_invitation_to_repeat(model)
    payment_intent = model.result_of("c-charge")["payment_intent"]
    [refunded] = await agent_stack.far_sides.refunds(payment_intent)
    assert refunded.object_id == model.result_of("c-refund")["refund"]
    [decision] = status["decisions"]
    assert (decision["step_id"], decision["decision"], decision["operator"]) == (
        "c-refund",
        "approve",
        "refund-desk",
    )


async def test_the_apps_state_reject_denies_a_refund_at_onceflow(
    agent_stack: AgentStack, onceflow: OnceflowClient, agent: Caller
) -> None:
    model = ScriptedModel(
        [
            call("charge_payment", "c-charge", charge(new_order_id())),
            call("refund_payment", "c-refund", {"charge_step": "c-charge"}),  # in full
            say("Only the shipping can be refunded."),
        ]
    )
    approver = await agent_stack.approver(agent)
    async with (
        OnceflowClient(agent_stack.gateway_url, api_key=approver.api_key) as screen,
        OnceflowRun(onceflow, tools=TOOLS, approver=screen) as run,
    ):
        support = support_agent(model, run)
        paused = await Runner.run(support, "Refund everything.", run_config=NO_TRACES)
        [item] = run.approvals(paused.interruptions)
        state = paused.to_state()
        state.reject(item, rejection_message="refund the shipping only")
        [decided] = await run.wait_for_decisions(state, timeout=HANG_SECONDS)
        finished = await Runner.run(support, state, run_config=NO_TRACES)
        status = await onceflow.status(run.task_id)

    assert decided.state == "denied"
    assert finished.final_output == "Only the shipping can be refunded."
    assert model.outputs["c-refund"] == "refund the shipping only"
    payment_intent = model.result_of("c-charge")["payment_intent"]
    assert await agent_stack.far_sides.refunds(payment_intent) == []
    [decision] = status["decisions"]
    assert (decision["decision"], decision["operator"], decision["reason"]) == (
        "deny",
        "refund-desk",
        "refund the shipping only",
    )
    assert [step["state"] for step in status["steps"]] == ["succeeded", "denied"]


async def test_invalid_arguments_and_a_rejected_call_go_back_to_the_model_as_tool_errors(
    agent_stack: AgentStack, onceflow: OnceflowClient
) -> None:
    order_id = new_order_id()
    model = ScriptedModel(
        [
            calls(
                ("charge_payment", "c-bad", {**charge(order_id), "amount": -5}),
                ("refund_payment", "c-none", {"charge_step": "c-nothing", "amount": 100}),
            ),
            call("charge_payment", "c-charge", charge(order_id)),
            say("Charged."),
        ]
    )

    async with OnceflowRun(onceflow, tools=TOOLS) as run:
        result = await Runner.run(support_agent(model, run), "Charge.", run_config=NO_TRACES)
        status = await onceflow.status(run.task_id)

    assert result.final_output == "Charged." and result.interruptions == []
    invalid, rejected = model.outputs["c-bad"], model.outputs["c-none"]
    assert invalid.startswith("error: ") and "amount" in invalid and "Nothing was done" in invalid
    assert rejected.startswith("error: ") and "no recorded PaymentIntent" in rejected
    no_invitation_to_repeat(model)
    # The invalid call never reached the task; the rejected one ran and failed.
    assert [(step["step_id"], step["state"]) for step in status["steps"]] == [
        ("c-none", "failed"),
        ("c-charge", "succeeded"),
    ]
    assert len(await agent_stack.far_sides.charges(order_id)) == 1


# ── without the stack: answers that never come ───────────────────────────────────────

CATALOGUE = [
    {
        "name": "refund_payment",
        "description": "Refund a charge.",
        "input_schema": {"type": "object", "properties": {"payment_intent": {"type": "string"}}},
    }
]


def fake_gateway(calls_answer: Callable[[httpx.Request], Any]) -> httpx.MockTransport:
    """A gateway that lists one tool, opens tasks, and answers calls with ``calls_answer``."""

    async def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/tools":
            return httpx.Response(200, json=CATALOGUE)
        if path == "/v1/tasks":
            return httpx.Response(201, json={"task_id": "task-1", "state": "running"})
        if path.endswith("/close"):
            return httpx.Response(200, json={"task_id": "task-1", "state": "closed"})
        response = calls_answer(request)
        return await response if inspect.isawaitable(response) else response

    return httpx.MockTransport(answer)


async def test_an_answer_that_never_arrives_is_never_an_invitation_to_call_again() -> None:
    keys: list[str] = []

    def lose_it(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["Idempotency-Key"])
        raise httpx.ReadTimeout("the answer was lost", request=request)

    model = ScriptedModel(
        [call("refund_payment", "c-refund", {"payment_intent": "pi_1"}), say("It is pending.")]
    )
    async with (
        OnceflowClient(
            "http://gateway.test", api_key="k", transport=fake_gateway(lose_it)
        ) as onceflow,
        OnceflowRun(onceflow, tools=["refund_payment"], retries=0) as run,
    ):
        result = await Runner.run(support_agent(model, run), "Refund pi_1.", run_config=NO_TRACES)

    assert result.final_output == "It is pending."
    output = model.outputs["c-refund"]
    assert output.startswith("outcome unknown: ") and "Do not call this tool again" in output
    no_invitation_to_repeat(model)
    # Asked twice (the approval question, then the tool), both times as the same call.
    assert len(keys) == 2 and len(set(keys)) == 1 and run.run_id in keys[0]


async def test_a_tool_timeout_after_an_approval_says_the_effect_may_exist() -> None:
    parked = {
        "task_id": "task-1",
        "task_state": "parked",
        "step_id": "c-refund",
        "tool": "refund_payment",
        "state": "parked",
        "ended": False,
        "park_reason": "the provider answered 500",
    }
    sent: list[httpx.Request] = []

    async def park_then_hang(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) == 1:
            return httpx.Response(202, json=parked)
        await asyncio.Event().wait()  # the gateway never answers again
        raise AssertionError("unreachable")

    model = ScriptedModel(
        [call("refund_payment", "c-refund", {"payment_intent": "pi_1"}), say("It is pending.")]
    )
    async with (
        OnceflowClient(
            "http://gateway.test", api_key="k", transport=fake_gateway(park_then_hang)
        ) as onceflow,
        OnceflowRun(onceflow, tools=["refund_payment"]) as run,
    ):
        [tool] = run.tools
        tool.timeout_seconds = 0.2  # the app's own limit on a tool call
        agent = support_agent(model, run)
        paused = await Runner.run(agent, "Refund pi_1.", run_config=NO_TRACES)
        state = paused.to_state()
        state.approve(paused.interruptions[0])  # without waiting for the person
        result = await Runner.run(agent, state, run_config=NO_TRACES)

    assert result.final_output == "It is pending."
    output = model.outputs["c-refund"]
    assert output.startswith("outcome unknown: ") and "ToolTimeoutError" in output
    assert "Do not call this tool again" in output
    no_invitation_to_repeat(model)
