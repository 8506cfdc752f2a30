"""onceflow's tools as a Nexus service, for agents that run as Temporal workflows.

A caller workflow calls ``OnceflowTools`` through an endpoint (``DEFAULT_ENDPOINT`` on
the dev stack) with ``workflow.create_nexus_client``; each operation is an onceflow task,
identified by the caller's workflow and call id, and completes with the task's final
``TaskStatus`` when it ends (open, so the caller waits durably, while a step is parked or
awaits approval). The onceflow worker serves it when ``nexus_principal`` names the
principal its callers act as. See docs/nexus.md.
"""

from onceflow.nexus._caller import NexusCaller, nexus_caller
from onceflow.nexus._endpoint import EndpointTaken, ensure_nexus_endpoint
from onceflow.nexus._handler import WITHDRAWN_BY_CALLER, OnceflowToolsHandler, PrincipalSource
from onceflow.nexus._principal import NexusPrincipal, PrincipalLookup
from onceflow.nexus._service import (
    DEFAULT_ENDPOINT,
    SERVICE_NAME,
    NexusPlan,
    NexusToolCall,
    OnceflowTools,
)

__all__ = [
    "DEFAULT_ENDPOINT",
    "SERVICE_NAME",
    "WITHDRAWN_BY_CALLER",
    "EndpointTaken",
    "NexusCaller",
    "NexusPlan",
    "NexusPrincipal",
    "NexusToolCall",
    "OnceflowTools",
    "OnceflowToolsHandler",
    "PrincipalLookup",
    "PrincipalSource",
    "ensure_nexus_endpoint",
    "nexus_caller",
]
