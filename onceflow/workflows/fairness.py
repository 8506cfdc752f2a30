"""Which fairness key a task's work is queued under: its tenant's.

Temporal's matching service dispatches a backlogged task queue in proportion to the
fairness keys of the tasks waiting on it ("Priority and Fairness"), so one tenant's storm
queues behind its own work instead of in front of every other tenant's. The key travels
with the task workflow (its start, both through ``TaskClient.start`` and Update-with-Start)
and with each tool activity the workflow schedules; a continued-as-new run keeps its
predecessor's priority (the server copies it).

Pure: the workflow calls it with the tenant its history fixes, the client with the one it
starts the task for.
"""

from temporalio.common import Priority

FAIRNESS_KEY_MAX_BYTES = 64
"""The server's limit on a fairness key; a tenant (``NAME_PATTERN``, at most 64 ASCII
characters) always fits."""


def tenant_priority(tenant: str) -> Priority:
    """The priority a task of ``tenant`` and its tool activities are queued with: its
    tenant as fairness key, weight left to the task queue's configuration (1.0 unless an
    operator set an override with ``temporal task-queue config set --fairness-key-weight``)."""
    if len(tenant.encode()) > FAIRNESS_KEY_MAX_BYTES:
        raise ValueError(f"tenant {tenant!r} is longer than a fairness key may be (64 bytes)")
    return Priority(fairness_key=tenant)
