"""What the workflow hands an activity for one attempt, and what it gets back."""

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from onceflow.retry_policy import OutcomeClass
from onceflow.tools._policy import ToolPolicy
from onceflow.tools._provider import ProviderHealth, Send


class KeyUnusable(StrEnum):
    """Why no further attempt may send under a step's child key: the workflow then looks
    the effect up and parks, whatever the budget allows."""

    SEND_BY_PASSED = "send_by_passed"
    """The key's send-by deadline passed: the provider may have forgotten it, so a send
    could make a second effect. Nothing was sent."""
    STORED_FAILURE = "stored_failure"
    """The provider stored a failure under the key and replays it for every repeat until
    it forgets the key: repeating cannot help."""


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
    policy: ToolPolicy
    """The tool's policy as the task carries it (its send-by window above all): every
    release's workflow sends it with each attempt (its saved histories show it)."""
    key_generation: int = Field(default=1, ge=1)
    """The step's key generation (part of its derived child keys): raised when an
    operator authorises a new attempt after the old key became unusable."""
    claimed_resource_id: str | None = None
    """Only in a look-up checking an operator's ``happened``: the resource the operator
    named. A look-up that verifies ids (``ToolContract.lookup_verifies_resource_ids``)
    reports ``succeeded`` with it only when it exists and belongs to this step."""
    accept_unverified: bool = False
    """Only with ``claimed_resource_id``: the operator accepted the resource unverified
    (a charge made by hand carries no operation id); the look-up records it as the
    step's effect whatever it finds, so later steps that read the record find it."""
    deliberate_repeat: bool = False
    """The call asked for a second effect identical to an earlier one on purpose
    (``CallInput.deliberate_repeat``): it claims no intent, and is recorded."""
    send: Send = Send.FIRST
    """What the attempt is to its provider's budget: a first send, a retry (an earlier
    attempt of the step reached the provider: it takes a token), or an operator's."""
    last_attempt_ended_at: datetime | None = None
    """Only in a look-up: when the step's last attempt ended. An eventual look-up's miss
    proves absence once ``miss_proves_absence_after`` has passed since then (never
    without it)."""


class ProviderHold(BaseModel):
    """Why an attempt was not sent: its provider's budget held it (``_provider``)."""

    model_config = ConfigDict(frozen=True)

    provider: str
    """The provider's name (``stripe``)."""
    health: ProviderHealth
    """Its state when the attempt asked."""
    recheck_in: timedelta
    """How long until asking again can help."""
    reason: str
    """Why, naming the provider and its state (``waiting for stripe to recover: …``)."""


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
    key_unusable: KeyUnusable | None = None
    """Set when no attempt may send under the step's key any more (send-by deadline
    passed, or a failure stored under it): the workflow looks up, then parks."""
    database_unavailable: bool = False
    """The attempt ended because onceflow's own database was unreachable (before the
    effect, or a local effect whose commit is deduplicated by its record): the workflow
    retries within the deadline without counting it against the attempt caps."""
    provider_hold: ProviderHold | None = None
    """Set by onceflow when nothing was sent because the provider's fleet-wide budget
    held the attempt (paused, throttled, or failing with its retry budget spent): the
    workflow waits for the provider, off the task's clock, and asks again."""
    throttled_for: timedelta | None = None
    """Set by a tool whose provider refused the request as one too many (HTTP 429):
    nothing was done, and the provider said "not now". The wait it asked for
    (``Retry-After``), or zero when it named none. Every send to the provider then waits
    that long (or ``Provider.throttle_hold``), and the attempt spends no attempt cap."""
    miss_proves_absence: bool = False
    """A look-up that found nothing by a read-after-write consistent read (a query in
    the tool's own transactional store, a provider's list API): the effect does not
    exist. The workflow acts on a look-up's miss (accepts an operator's
    ``did_not_happen``) only when it proves absence this way or by
    ``miss_proves_absence_after``. Default False: a miss proves nothing."""
    miss_proves_absence_after: timedelta | None = None
    """An eventually consistent look-up (a search index): how long after the step's last
    attempt its miss proves absence. Default None. The activity wrapper sets
    ``miss_proves_absence`` once that much time has passed (by the worker's clock, so
    the workflow's decision replays from the recorded answer)."""
