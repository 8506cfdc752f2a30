"""The Nexus endpoint that routes ``OnceflowTools`` calls to onceflow's task queue.

Created through the operator service (as ``temporal operator nexus endpoint create``
does), once: an endpoint of that name already routing there is kept as it is, so
``onceflow dev`` can create it on every start. An endpoint of that name routing
elsewhere is an operator's: refused, never overwritten.
"""

from temporalio.api.nexus.v1 import EndpointSpec, EndpointTarget
from temporalio.api.operatorservice.v1 import (
    CreateNexusEndpointRequest,
    ListNexusEndpointsRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode


class EndpointTaken(RuntimeError):
    """A Nexus endpoint of that name exists and routes to another namespace or queue."""


async def ensure_nexus_endpoint(
    client: Client, *, name: str, task_queue: str, namespace: str | None = None
) -> None:
    """Create the endpoint ``name`` targeting ``task_queue`` in ``namespace`` (default the
    client's), unless it exists with that target already.

    Raises:
        EndpointTaken: It exists with another target.
    """
    namespace = namespace or client.namespace
    target = EndpointTarget(
        worker=EndpointTarget.Worker(namespace=namespace, task_queue=task_queue)
    )
    spec = EndpointSpec(name=name, target=target)
    try:
        await client.operator_service.create_nexus_endpoint(CreateNexusEndpointRequest(spec=spec))
        return
    except RPCError as error:
        if error.status is not RPCStatusCode.ALREADY_EXISTS:
            raise
    listed = await client.operator_service.list_nexus_endpoints(
        ListNexusEndpointsRequest(name=name)
    )
    found = [endpoint for endpoint in listed.endpoints if endpoint.spec.name == name]
    if not found or found[0].spec.target != target:
        raise EndpointTaken(
            f"Nexus endpoint {name!r} exists and routes elsewhere; it is left as it is"
        )
