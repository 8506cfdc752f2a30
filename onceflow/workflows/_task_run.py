"""``TaskRun``: what one workflow run of a task keeps beside its ``TaskMemory``.

``TaskMemory`` is what a task knows across continue-as-new, carried whole. ``TaskRun`` is
the rest: the live state, the decisions in flight, the timers, the flags of this run. A
continued run starts it afresh, which is safe because a task continues as new only when no
call is unfinished. It lives in the worker's memory only: it is never serialized, so it
is a plain dataclass, not a model, and its containers are made per run
(``default_factory``), never shared between runs. It has slots: one is held for every
cached task, and slots hold its fields without an attribute dict.
"""

import asyncio
from dataclasses import dataclass, field
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from onceflow.tools import ToolAttemptResult
    from onceflow.tools.worker import KeyUnusable
    from onceflow.workflows.task_models import ApproveInput, ReconcileInput, TaskState


@dataclass(frozen=True)
class KeyWindow:
    """The send window of one key generation of a step: closed once ``timer`` fired."""

    generation: int
    timer: "asyncio.Task[None]"


class DecisionCheck(BaseModel):
    """What checking a reconcile decision with the tool's look-up concluded."""

    refusal: str | None = None
    """Why the decision is refused; None when it may act."""
    verified: bool | None = None
    """Whether the look-up confirmed the decision (see ``DecisionRecord.verified``)."""
    finding: str | None = None
    """What the look-up found, in words (ids, amounts)."""


@dataclass(slots=True)
class TaskRun:
    """This run's own state of a task: everything the workflow's parts share that
    ``TaskMemory`` does not carry to the next run."""

    waiting_since: datetime
    """When the current wait off the task's clock began (the task's start before any)."""
    state: TaskState = TaskState.RUNNING
    """The task's state as last published (search attribute ``TaskState``)."""
    failure_reason: str | None = None
    """Why a plan failed, once it did."""
    approvals: dict[str, ApproveInput] = field(default_factory=dict)
    """Per step: the approval decision accepted for it."""
    reconciliations: dict[str, ReconcileInput] = field(default_factory=dict)
    """Per parked step: the reconcile decision accepted for it, until the step takes it."""
    checking: set[str] = field(default_factory=set)
    """Steps whose reconcile decision is being checked: others wait for the answer."""
    check_requests: dict[str, ReconcileInput] = field(default_factory=dict)
    """Per parked step: a decision its handler asks the step's coroutine to check."""
    check_verdicts: dict[str, DecisionCheck] = field(default_factory=dict)
    """Per parked step: the check of that decision, for its handler to take."""
    verified: dict[str, ToolAttemptResult] = field(default_factory=dict)
    """Per step: what the look-up found when it verified an accepted ``happened``."""
    unusable_keys: dict[str, KeyUnusable] = field(default_factory=dict)
    """Steps parked because no attempt may send under their key any more, and why."""
    key_windows: dict[str, KeyWindow] = field(default_factory=dict)
    """Per running step of a tool whose provider forgets keys: its key's send window."""
    waiting_for_people: int = 0
    """Waits off the task's clock under way (for a person, or for a provider)."""
    asked_people: bool = False
    """Whether a step ever waited for a person (an approval, a reconciliation)."""
    starter_stopped_waiting: bool = False
    """Whether the request that started the plan answered before it ended."""
    closing: str | None = None
    """Why an open task takes no more calls, once it does not."""
    pinning: set[str] = field(default_factory=set)
    """Tools a call's coroutine is pinning (retired with ``POLICIES_CARRIED``)."""
    clock_before_pin: dict[str, datetime] = field(default_factory=dict)
    """Per step: the time before a local activity pinned its policy, when the step
    runs right after it (retired with ``POLICIES_CARRIED``). A clock read there would
    not replay (Core may deliver the activity's result a workflow task later live than
    on replay), so the step's first attempt, or its wait for approval, counts from it."""
    published_tools: list[str] = field(default_factory=list)
    """An open task's tools as last published (search attribute ``TaskTools``)."""
    calls_this_run: int = 0
    """Calls an open task took in this run (``OpenTaskOptions.calls_per_run``)."""
    changed: bool = False
    """Something the open task's main loop reacts to happened (a call, an end)."""
    call_crash: BaseException | None = None
    """What a call's coroutine raised that was not the call's own end (a worker
    without the tool, a bug): the main loop raises it, failing the workflow task."""
    decision_admitted_at: int = 0
    """History length of the workflow task that admitted the last decision Update
    (approve, reconcile, close): see ``TaskBook.end_durably``."""
    started_on_0_1_0: bool = False
    """This run was started by release 0.1.0: it issues the commands 0.1.0 did where
    a later release changed them (``TaskBook.take_release_of_start``)."""
    release_known: bool = False
    """Whether ``started_on_0_1_0`` was learnt yet (once per run)."""
