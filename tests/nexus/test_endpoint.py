"""The Nexus endpoint helper ``onceflow dev`` and the tests create endpoints with."""

import uuid

import pytest
from temporalio.api.operatorservice.v1 import ListNexusEndpointsRequest
from temporalio.testing import WorkflowEnvironment

from onceflow.nexus import EndpointTaken, ensure_nexus_endpoint


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
