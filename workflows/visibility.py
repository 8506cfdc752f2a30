"""Search attributes onceflow publishes so operators can filter tasks in the Temporal UI.

A production namespace must have them registered once, e.g.
``temporal operator search-attribute create --name OnceflowState --type Keyword``.
"""

from temporalio.common import SearchAttributeKey

TASK_STATE = SearchAttributeKey.for_keyword("OnceflowState")
"""running, awaiting_approval, parked, succeeded or failed."""
TASK_TENANT = SearchAttributeKey.for_keyword("OnceflowTenant")
"""The tenant the task belongs to."""
TASK_TOOLS = SearchAttributeKey.for_keyword_list("OnceflowTools")
"""Every tool the task calls."""

ALL_SEARCH_ATTRIBUTES = (TASK_STATE, TASK_TENANT, TASK_TOOLS)
