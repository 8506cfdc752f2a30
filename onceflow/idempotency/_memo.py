"""The memo fields that tie a task to the claim and the request that started it: stored
with the workflow when the boundary starts it, never changed."""

REQUEST_HASH_MEMO = "onceflow_request_hash"
"""The fingerprint of the request that started the task (set by the boundary): a repeat
after its record was pruned joins the task only with the same fingerprint, and the upkeep
pass writes an ended task's outcome into an unmarked claim only for its own request."""
STARTED_BY_CLAIM_MEMO = "onceflow_started_by_claim"
"""The claim whose owner started the task (a digest of its owner token, set by the
boundary): whether an answer is a replay depends on who started the task, not on whether
the task is still running when the gateway looks."""
