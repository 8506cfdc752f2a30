"""The OpenAI Agents SDK's Temporal integration calls onceflow over Nexus
(``onceflow_client.openai_agents_temporal``): one charge at the provider, the model's repeat
answered "already done", a parked call holding the agent until it is reconciled.

The caller (its workflow, its worker with ``OpenAIAgentsPlugin`` and a scripted model:
``openai_agents_caller.py``) runs in the Makefile's client-only virtualenv (the integration
also pins an openai-agents this one cannot hold), in a process that replays its histories
with its own plugin when it stops; onceflow's are replayed by the session's."""

import json
import subprocess
from typing import Any

import pytest
from onceflow_client._nexus_told import told_about_step
from onceflow_client.openai_agents_temporal import ALREADY_DONE, _output
from onceflow_devstack.stripe_provider import ProviderControl
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.nexus import NexusPrincipal
from tests.payments.conftest import TENANT, charge_intents

from .agent_callers import AgentCaller
from .caller_process import OPENAI_AGENTS_ENDPOINT, OPENAI_AGENTS_WORKFLOW

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

AGENT = AgentCaller(
    "openai_agents_caller",
    OPENAI_AGENTS_WORKFLOW,
    OPENAI_AGENTS_ENDPOINT,
    NexusPrincipal(tenant=TENANT, name="oai-agents"),
    "openai-agents",
)


task_queue, onceflow_worker, caller = AGENT.fixtures()


async def test_an_openai_agent_in_a_workflow_charges_once_and_its_repeat_is_already_done(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
    control: ProviderControl,
) -> None:
    handle = await AGENT.run(dev_server)
    first, repeat = json.loads(await handle.result())

    [intent] = await charge_intents(control)
    assert json.loads(first)["payment_intent"] == intent
    assert repeat.startswith(ALREADY_DONE) and intent in repeat and "repeat_of" in repeat
    # Each tool call is a Nexus operation of the agent's workflow; its only activities
    # are the model's.
    events = (await handle.fetch_history()).events
    operations = [e for e in events if e.HasField("nexus_operation_scheduled_event_attributes")]
    activities = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert len(operations) == 2 and activities == {"invoke_model_activity"}, activities


async def test_a_parked_call_holds_the_openai_agent_until_it_is_reconciled(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
    control: ProviderControl,
) -> None:
    first, repeat, intent = await AGENT.parked_then_reconciled(dev_server, control)

    # The model is told the charge the operator's decision made known, verified.
    told = json.loads(first)
    assert told["payment_intent"] == intent and told["reconciled"] is True
    assert repeat.startswith(ALREADY_DONE) and intent in repeat
    assert await charge_intents(control) == [intent]


@pytest.mark.parametrize(
    ("step", "reads"),
    [
        ({"state": "succeeded", "resource_id": "pi_1"}, '{"resource_id": "pi_1"}'),
        (
            {
                "state": "failed",
                "failure_reason": "card_declined",
                "attempts": [{"outcome": "rejected"}],
            },
            "error: rejected, nothing was done: card_declined. You may correct the arguments",
        ),
        ({"state": "denied", "failure_reason": "no"}, "error: denied by a person: no. Do not"),
        ({"state": "abandoned"}, "error: abandoned by an operator: abandoned. Whether"),
        (
            {"state": "failed", "failure_reason": "boom", "attempts": [{"outcome": "unknown"}]},
            "error: failed: boom. onceflow has retried it",
        ),
    ],
)
def test_what_the_openai_model_reads_per_outcome(step: dict[str, Any], reads: str) -> None:
    assert _output(told_about_step(step)).startswith(reads)
