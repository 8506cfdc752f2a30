"""Intent identity: what makes two calls one business intent, whatever key, task,
surface or process they come from (the article's first lesson: write the business
invariant first, and let the database enforce it across every writer).

Pure policy: which arguments identify an intent, its digest, and what an attempt's
outcome makes of the intent's record. ``_intent_claims`` keeps the record.
"""

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from onceflow.retry_policy import OutcomeClass

__all__ = ["IntentIdentity", "IntentState", "intent_digest", "state_after"]


@dataclass(frozen=True, kw_only=True)
class IntentIdentity:
    """What identifies one business intent of a tool, with the tenant and the tool's name.

    While one call of an intent holds it (running, its outcome unknown or parked, or
    succeeded within ``window``), any other call of the same intent (another key,
    another task, another surface or gateway) sends nothing and is answered with the
    first: the effect it made (``result["repeat_of"]``) or, while that is not known yet,
    a refusal naming the call that holds it. A call whose every attempt ended without
    effect (rejected, transient) frees the intent. A second identical effect on purpose
    is a deliberate repeat (``CallInput.deliberate_repeat``), which claims nothing.
    """

    arguments: tuple[str, ...] | None = None
    """The validated arguments that identify it (e.g. ``("order_id", "amount",
    "currency")``); None, the default: all of them."""
    task_relative: tuple[str, ...] = ()
    """Arguments that name something inside the task (a refund's ``charge_step``): when
    one is set, the intent is the task's own and other tasks never share it."""
    window: timedelta = timedelta(hours=24)
    """How long after its first attempt a succeeded intent still answers an identical
    one; after it, the same arguments are a new intent (a monthly charge). An intent
    whose effect is in doubt (its step parked) stays held however long it waits.
    Default 24 h."""


class IntentState(StrEnum):
    """What an intent's holder has done so far."""

    RUNNING = "running"
    """An attempt is sending (or died sending): its effect may exist."""
    UNKNOWN = "unknown"
    """An attempt's outcome is unknown (the step retries, looks up or parks)."""
    SUCCEEDED = "succeeded"
    NO_EFFECT = "no_effect"
    """Every attempt so far ended without effect: another call may take the intent."""


def intent_digest(tool: str, identity: IntentIdentity, args: BaseModel, *, workflow_id: str) -> str:
    """The digest of one intent: the tool and the identifying validated arguments
    (canonical JSON), and the task when a task-relative argument is set."""
    values: dict[str, Any] = args.model_dump(mode="json")
    if identity.arguments is not None:
        values = {name: values.get(name) for name in identity.arguments}
    scoped = any(values.get(name) is not None for name in identity.task_relative)
    canonical = json.dumps(
        {"tool": tool, "arguments": values, "task": workflow_id if scoped else None},
        sort_keys=True,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def state_after(outcome: OutcomeClass) -> IntentState:
    """What one attempt's outcome says of the intent. The record keeps it ``unknown``
    instead of ``no_effect`` when an earlier attempt of the holder may have made the
    effect (its outcome was unknown, or it died sending): no later attempt clears that."""
    if outcome is OutcomeClass.SUCCEEDED:
        return IntentState.SUCCEEDED
    if outcome is OutcomeClass.UNKNOWN:
        return IntentState.UNKNOWN
    return IntentState.NO_EFFECT
