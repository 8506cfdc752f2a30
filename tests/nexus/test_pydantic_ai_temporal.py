"""PydanticAI's Temporal durability calls onceflow over Nexus
(``onceflow_client.pydantic_ai_temporal``): one charge at the provider, the model's repeat
answered "already done", a parked call holding the agent until it is reconciled.

The caller (its workflow, its worker with PydanticAI's plugins and a scripted model:
``pydantic_ai_caller.py``) runs in the Makefile's client-only virtualenv, in a process that
replays its histories with its own plugins when it stops; onceflow's are replayed by the
session's."""

import json
import subprocess

import pytest
from onceflow_client.pydantic_ai_temporal import ALREADY_DONE
from onceflow_devstack.stripe_provider import ProviderControl
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.nexus import NexusPrincipal
from tests.payments.conftest import TENANT, charge_intents

from .agent_callers import AgentCaller
from .caller_process import PYDANTIC_AI_ENDPOINT, PYDANTIC_AI_WORKFLOW

pytestmark = [pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")]

AGENT = AgentCaller(
    "pydantic_ai_caller",
    PYDANTIC_AI_WORKFLOW,
    PYDANTIC_AI_ENDPOINT,
    NexusPrincipal(tenant=TENANT, name="agents"),
    "pydantic-ai",
)


task_queue, onceflow_worker, caller = AGENT.fixtures()


async def test_a_durable_pydantic_ai_agent_charges_once_and_its_repeat_is_already_done(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
    control: ProviderControl,
) -> None:
    first, repeat = json.loads(await (await AGENT.run(dev_server)).result())

    [intent] = await charge_intents(control)
    assert intent in json.dumps(first)
    assert isinstance(repeat, str) and repeat.startswith(ALREADY_DONE) and intent in repeat
    assert "repeat_of" in repeat


async def test_a_parked_call_holds_the_agent_until_it_is_reconciled_then_the_run_goes_on(
    dev_server: WorkflowEnvironment,
    onceflow_worker: Worker,
    caller: subprocess.Popen[str],
    control: ProviderControl,
) -> None:
    first, repeat, intent = await AGENT.parked_then_reconciled(dev_server, control)

    # The model is told the charge the operator's decision made known, verified.
    assert first["payment_intent"] == intent and first["reconciled"] is True
    assert isinstance(repeat, str) and repeat.startswith(ALREADY_DONE) and intent in repeat
    assert await charge_intents(control) == [intent]
