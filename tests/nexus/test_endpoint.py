"""The Nexus endpoint helper ``onceflow dev`` and the tests create endpoints with, and the
worker's ``nexus_principal`` setting."""

import uuid

import pytest
from temporalio.api.operatorservice.v1 import ListNexusEndpointsRequest
from temporalio.testing import WorkflowEnvironment

from onceflow.nexus import EndpointTaken, NexusPrincipal, ensure_nexus_endpoint
from onceflow.settings import InvalidSettings, OnceflowSettings
from onceflow.worker import nexus_service


async def test_an_endpoint_is_created_once_and_one_routing_elsewhere_is_left_alone(
    dev_server: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_server.client
    name = f"onceflow-tools-{uuid.uuid4().hex[:8]}"

    await ensure_nexus_endpoint(client, name=name, task_queue=task_queue)
    await ensure_nexus_endpoint(client, name=name, task_queue=task_queue)  # a restart

    listed = await client.operator_service.list_nexus_endpoints(
        ListNexusEndpointsRequest(name=name)
    )
    [endpoint] = listed.endpoints
    assert endpoint.spec.target.worker.task_queue == task_queue
    assert endpoint.spec.target.worker.namespace == client.namespace
    with pytest.raises(EndpointTaken, match=name):
        await ensure_nexus_endpoint(client, name=name, task_queue="another-queue")
    again = await client.operator_service.list_nexus_endpoints(ListNexusEndpointsRequest(name=name))
    assert again.endpoints[0].version == endpoint.version  # untouched


def test_a_nexus_principal_setting_that_is_not_tenant_slash_name_is_refused() -> None:
    with pytest.raises(InvalidSettings, match="ONCEFLOW_NEXUS_PRINCIPAL"):
        nexus_service(
            None,  # type: ignore[arg-type]  # refused before either is used
            None,  # type: ignore[arg-type]
            OnceflowSettings(nexus_principal="acme-without-a-name"),
            tools=(),
        )
    assert nexus_service(None, None, OnceflowSettings(), tools=()) is None  # type: ignore[arg-type]
    assert NexusPrincipal.parse("acme/agents") == NexusPrincipal(tenant="acme", name="agents")
