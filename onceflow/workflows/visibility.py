"""Search attributes onceflow publishes so operators can filter tasks in the Temporal UI.

A production namespace must have them registered once (the embedded stack and the tests
register them), e.g.
``temporal operator search-attribute create --name OnceflowState --type Keyword``;
docs/production.md ("Run it in production") registers them all.
"""

from temporalio.common import SearchAttributeKey

TASK_STATE = SearchAttributeKey.for_keyword("OnceflowState")
"""What the task published while it ran: running, awaiting_approval or parked; failed for
a plan that failed. A task that succeeded or closed since 0.6.0 publishes no end: its close
status says it (``AgentTaskInput.ends_by_close_status``, read by ``onceflow.task_api``'s
listings); earlier ones published succeeded or closed."""
TASK_TENANT = SearchAttributeKey.for_keyword("OnceflowTenant")
"""The tenant the task belongs to."""
TASK_TOOLS = SearchAttributeKey.for_keyword_list("OnceflowTools")
"""Every tool the task calls."""
TASK_PARKED_AT = SearchAttributeKey.for_datetime("OnceflowParkedAt")
"""When the task last parked; unset again once a decision resumes it. Set in the same
upsert as ``OnceflowState``, so parking adds no workflow command."""

TASK_KIND = SearchAttributeKey.for_keyword("OnceflowKind")
"""``open`` (an agent's open task: calls arrive one by one) or ``plan`` (fixed steps)."""

ALL_SEARCH_ATTRIBUTES = (TASK_STATE, TASK_TENANT, TASK_TOOLS, TASK_PARKED_AT, TASK_KIND)
