"""What the workflow hands an activity for one attempt, and what it gets back."""

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from onceflow.retry_policy import OutcomeClass


class ToolCallInput(BaseModel):
    """One attempt at one step; the activity derives child keys from it."""

    model_config = ConfigDict(frozen=True)

    tenant: str
    principal: str
    workflow_id: str
    step_id: str
    tool: str
    arguments: dict[str, Any]
    attempt: int = Field(ge=1)
    """1-based attempt number of this step: for logs only, never part of a key."""
    evidence: dict[str, str] = Field(default_factory=dict)
    """What earlier attempts of this step learnt (resource and request ids), for lookups."""


class ToolAttemptResult(BaseModel):
    """How one attempt ended, classified by the activity that made it."""

    outcome: OutcomeClass
    resource_id: str | None = None
    """The business resource the step produced or found (order id, PaymentIntent id)."""
    result: dict[str, Any] = Field(default_factory=dict)
    """The tool's documented result body."""
    reason: str | None = None
    """Why the attempt was not a success, in words an operator can act on."""
    evidence: dict[str, str] = Field(default_factory=dict)
    """Correlation ids for reconciliation: child key digest, request ids, timestamps."""
