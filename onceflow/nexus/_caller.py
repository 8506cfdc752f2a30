"""Who is calling: the identity a Nexus operation's onceflow task is derived from.

A caller workflow's Temporal server links each operation it starts to the caller's
workflow (a ``WorkflowEvent`` link: namespace, workflow id, run id, event). The caller's
namespace and workflow id (never its run id, which a retry or continue-as-new changes)
with the caller's ``call_id`` name one call for good: the caller's replays schedule
nothing again, and its retries of the start carry the same request. A caller that is no
workflow sends no such link; its operation's request id stands in for the workflow.
"""

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import nexusrpc

WORKFLOW_EVENT_LINK = "temporal.api.common.v1.Link.WorkflowEvent"
"""The link type a caller workflow's server sends with each operation it starts."""
_WORKFLOW_PATH = re.compile(r"^/namespaces/(?P<namespace>[^/]+)/workflows/(?P<workflow_id>[^/]+)/")


@dataclass(frozen=True)
class NexusCaller:
    """The caller of one operation: a workflow (namespace and id) or a bare request."""

    namespace: str | None
    workflow_id: str | None
    request_id: str

    @property
    def is_workflow(self) -> bool:
        """Whether a workflow called (its identity survives the request's)."""
        return self.workflow_id is not None

    def call_key(self, call_id: str) -> str:
        """The idempotency key of the caller's call ``call_id`` (unambiguous JSON; only
        its digest leaves this process, in the task's workflow id)."""
        if self.workflow_id is not None:
            parts = ["workflow", self.namespace or "", self.workflow_id, call_id]
        else:
            parts = ["request", self.request_id, call_id]
        return json.dumps(["nexus", *parts], separators=(",", ":"))


def nexus_caller(links: Sequence[nexusrpc.Link], request_id: str) -> NexusCaller:
    """The caller named by an operation's inbound links, else by its request id."""
    for link in links:
        if link.type != WORKFLOW_EVENT_LINK:
            continue
        found = _WORKFLOW_PATH.match(urlparse(link.url).path)
        if found is not None:
            return NexusCaller(
                namespace=unquote(found["namespace"]),
                workflow_id=unquote(found["workflow_id"]),
                request_id=request_id,
            )
    return NexusCaller(namespace=None, workflow_id=None, request_id=request_id)
