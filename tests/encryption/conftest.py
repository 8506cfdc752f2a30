"""A stack whose every Temporal client encrypts: a worker, a gateway and its codec endpoint.

The worker (``build_worker``) and the gateway (``open_boundary`` + ``build_app``) run in the
test process on the real Temporal dev server and PostgreSQL, each with a client from
``connect_temporal(encryption=...)``, exactly as ``onceflow worker`` and ``onceflow
gateway`` build theirs; payments go to the local Stripe-compatible provider, whose
ledger is the far side the tests read.
"""

import base64
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import pytest
from onceflow_devstack.stripe_provider import ProviderConfig, ProviderControl, running_provider
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.encryption import PayloadEncryptionSettings
from onceflow.gateway import GatewaySettings, open_boundary
from onceflow.gateway.http_api import build_app
from onceflow.gateway.http_server import HttpServer
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient, connect_temporal
from onceflow.worker import build_worker
from onceflow.workflows.task_models import AgentTaskInput, StepInput, TaskState
from tests.gateway.conftest import stripe_tools
from tests.harness import wait_for

KEY_ID = "k2026-05"
KEY = base64.b64encode(bytes(range(7, 39))).decode()
KEYS = f"{KEY_ID}:{KEY}"
"""What ``ONCEFLOW_PAYLOAD_KEYS`` holds in every process of these tests."""
UI_ORIGIN = "http://127.0.0.1:8233"


def encryption_settings(ui_origin: str = UI_ORIGIN) -> PayloadEncryptionSettings:
    """The ``[payload_encryption]`` section every process of the stack reads."""
    return PayloadEncryptionSettings(payload_keys=(SecretStr(KEYS),), ui_origin=ui_origin)


@dataclass(frozen=True)
class EncryptedStack:
    """A task queue served by an encrypting worker, and a gateway with the codec endpoint."""

    client: Client
    """An encrypting client (as ``connect_temporal`` builds with the keys)."""
    tasks: TaskClient
    temporal_address: str
    gateway_url: str
    provider: ProviderControl
    """The Stripe-compatible provider's control API: its ledger is the far side."""

    @property
    def codec_endpoint(self) -> str:
        """What the UI and the CLI are given as the remote codec endpoint."""
        return f"{self.gateway_url}/codec"


@asynccontextmanager
async def encrypted_stack(
    postgres_url: str,
    temporal_address: str,
    encryption: PayloadEncryptionSettings,
    *,
    gateway_port: int = 0,
) -> AsyncIterator[EncryptedStack]:
    """A fresh task queue, an encrypting in-process worker and gateway on ``gateway_port``."""
    task_queue = f"enc-{uuid.uuid4().hex[:10]}"
    settings = OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=2)
    client = await connect_temporal(address=temporal_address, encryption=encryption)
    async with (
        running_provider(ProviderConfig()) as provider,
        ProviderControl(provider.base_url) as control,
        build_pool(postgres_url, max_size=6) as pool,
        build_worker(client, pool, settings, tools=stripe_tools(provider.base_url)),
        open_boundary(
            settings,
            # A start answers 202 after this wait: its task waits for an approval.
            GatewaySettings(replay_wait_seconds=1),
            database_url=postgres_url,
            temporal_address=temporal_address,
            encryption=encryption,
        ) as service,
    ):
        server = HttpServer(
            build_app(lambda: nullcontext(service), encryption=encryption),
            host="127.0.0.1",
            port=gateway_port,
            handle_signals=False,
        )
        url = await server.start()
        try:
            yield EncryptedStack(
                client=client,
                tasks=TaskClient(client, task_queue=task_queue),
                temporal_address=temporal_address,
                gateway_url=url,
                provider=control,
            )
        finally:
            await server.stop()


@pytest.fixture(scope="package")
async def stack(
    postgres_url: str, dev_server: WorkflowEnvironment
) -> AsyncIterator[EncryptedStack]:
    """The package's encrypted stack on the shared dev server."""
    address = dev_server.client.service_client.config.target_host
    async with encrypted_stack(postgres_url, address, encryption_settings()) as served:
        yield served


async def order_task(stack: "EncryptedStack", customer_id: str, *, tenant: str, prefix: str) -> str:
    """Start a one-step ``create_order`` task for ``customer_id`` (customer data for the
    history) and wait until it succeeded; its task id."""
    task_id = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await stack.tasks.start(
        AgentTaskInput(
            tenant=tenant,
            principal="agent",
            steps=[
                StepInput(
                    step_id="order",
                    tool="create_order",
                    arguments={
                        "customer_id": customer_id,
                        "currency": "eur",
                        "lines": [{"sku": "mug", "quantity": 1, "unit_price_cents": 900}],
                    },
                )
            ],
        ),
        workflow_id=task_id,
    )
    await wait_for(stack.tasks, task_id, lambda status: status.state is TaskState.SUCCEEDED)
    return task_id


def readable_text(document: Any) -> str:
    """Everything a reader of ``document`` (Temporal's JSON of events or payloads) can see,
    with every payload's base64 metadata and data decoded: plaintext in a payload shows."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                if name in ("data", "metadata") and isinstance(value, str | dict):
                    for encoded in value.values() if isinstance(value, dict) else [value]:
                        found.append(_unbase64(str(encoded)))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, str):
            found.append(node)

    walk(document)
    return "\n".join([json.dumps(document), *found])


def _unbase64(text: str) -> str:
    try:
        return base64.b64decode(text, validate=True).decode("utf-8", "replace")
    except ValueError:
        return text
