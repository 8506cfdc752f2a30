"""One agent framework's caller as its test module drives it (``test_pydantic_ai_temporal``,
``test_openai_agents_temporal``): its process, its queues, its runs, and the park its first
charge goes through."""

import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from onceflow_devstack.stripe_provider import ProviderControl
from psycopg_pool import AsyncConnectionPool
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from onceflow.nexus import NexusPrincipal, ensure_nexus_endpoint
from onceflow.payments import StripePaymentProvider
from onceflow.task_api import TaskClient
from tests.payments.conftest import charge_intents, order

from .caller_venv import caller_running
from .onceflow_side import (
    make_charges_unknowable,
    nexus_task_id,
    reconcile_as_happened,
    serving_nexus,
    until_parked,
)


@dataclass
class AgentCaller:
    """A caller module's agent: ``workflow`` (by name) in ``module``'s process, calling
    ``endpoint`` as ``principal``; ``tag`` names its queues, workflow ids and orders."""

    module: str
    workflow: str
    endpoint: str
    principal: NexusPrincipal
    tag: str
    onceflow_queue: str = ""
    """onceflow's queue for the module's tests: the agent's endpoint (a module constant,
    as in a user's code) routes there for the whole session."""
    caller_queue: str = ""
    started: int = 0
    """How many agent workflows the module started: each must be replayed."""

    def __post_init__(self) -> None:
        self.onceflow_queue = f"test-{self.tag}-{uuid.uuid4().hex[:8]}"
        self.caller_queue = f"caller-{self.tag}-{uuid.uuid4().hex[:8]}"

    def fixtures(self) -> tuple[Any, Any, Any]:
        """The module's ``task_queue`` (onceflow's queue), ``onceflow_worker`` (serving the
        agent's endpoint as its principal, who may charge) and ``caller`` fixtures."""

        @pytest.fixture(name="task_queue")
        def onceflow_queue() -> str:
            return self.onceflow_queue

        @pytest.fixture(name="onceflow_worker")
        async def onceflow_worker(
            dev_server: WorkflowEnvironment,
            pool: AsyncConnectionPool,
            payment_provider: StripePaymentProvider,
        ) -> AsyncIterator[Worker]:
            client, queue = dev_server.client, self.onceflow_queue
            await ensure_nexus_endpoint(client, name=self.endpoint, task_queue=queue)
            async with serving_nexus(
                client, pool, payment_provider, queue, self.principal, ["charge_payment"]
            ) as running:
                yield running

        @pytest.fixture(name="caller", scope="module")
        def caller(dev_server: WorkflowEnvironment) -> Iterator[subprocess.Popen[str]]:
            """The caller application's worker, in the client-only virtualenv; when the
            module's tests are done it replays every history it ran, and none may diverge."""
            with caller_running(
                self.module,
                self.caller_queue,
                dev_server.client.service_client.config.target_host,
                lambda: self.started,
            ) as process:
                yield process

        return onceflow_queue, onceflow_worker, caller

    async def run(self, dev_server: WorkflowEnvironment) -> WorkflowHandle[Any, str]:
        """Starts the agent, prompted with a charge of an order of its own."""
        handle: WorkflowHandle[Any, str] = await dev_server.client.start_workflow(
            self.workflow,
            json.dumps(order(self.tag)),
            id=f"agent-{self.tag}-{uuid.uuid4().hex[:12]}",
            task_queue=self.caller_queue,
            result_type=str,
        )
        self.started += 1
        return handle

    async def parked_then_reconciled(
        self, dev_server: WorkflowEnvironment, control: ProviderControl
    ) -> tuple[Any, Any, str]:
        """Runs the agent with its first charge parked, holding the agent's workflow until
        an operator reconciles it as happened; the agent's two answers and the intent."""
        await make_charges_unknowable(control)
        tasks = TaskClient(dev_server.client, task_queue=self.onceflow_queue)
        handle = await self.run(dev_server)
        # The model's first tool call, as the handler derives its task.
        task_id = nexus_task_id(
            self.principal, dev_server.client.namespace, handle.id, "call_first", "charge_payment"
        )
        await until_parked(tasks, task_id, what="the agent's charge parks")
        await control.clear_faults()
        assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING
        [intent] = await charge_intents(control)
        await reconcile_as_happened(tasks, task_id, intent)
        first, repeat = json.loads(await handle.result())
        return first, repeat, intent
