"""The four ways an attempt at a side effect can end."""

from enum import StrEnum


class OutcomeClass(StrEnum):
    """How one attempt ended, as far as the caller can prove.

    Every attempt ends as exactly one of these; the class, not the exception type,
    drives what the workflow does next.
    """

    SUCCEEDED = "succeeded"
    """The effect happened and its result is known."""
    REJECTED = "rejected"
    """A permanent error with no effect; repeating cannot help."""
    TRANSIENT = "transient"
    """Known to have had no effect (e.g. refused before sending); safe to retry."""
    UNKNOWN = "unknown"
    """An effect may have happened (timeout after sending, lost response, crash)."""
