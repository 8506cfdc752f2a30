"""The boundary's idempotency record: one row per ``(scope, key)`` in PostgreSQL, the store
that claims and writes it (``IdempotencyStore``, its state machine in ``_store``), what it
keeps of an ended task (``stored_outcome``, the caller's ``TaskView``) and the memo fields
that tie a task to the claim and the request that started it.

Who writes a task's outcome into its record, and why four writers: the record is the
boundary's answer to every repeat of the request, so it must be written once the task
ends even when the writer meant to write it died. Every writer uses the same fenced
statement (``IdempotencyStore.record_outcome``: only a record still processing, naming the
task's workflow id and not bound to another run), so the first write wins and a later one
changes nothing.

1. **The starter**: the gateway request that claimed the key and started a plan task (or a
   tool call) awaits its result for a bounded time anyway, so when the task ends within
   that wait it writes the outcome itself, one ``UPDATE`` off the task's own path, and the
   task ends without a write of its own. It marks the record started only once the task
   ran for ``MARK_STARTED_AFTER`` (the gateway's ``_task_starts``), so a task that ends
   sooner costs one write after the claim, its outcome's.
2. **The workflow** (the local activity ``record_task_outcome``, on the worker that ends
   the task) when nobody waits for its end: always for an open task (its creation was
   answered at once); for a plan task only once it asked people (an approval, a
   reconciliation: its request was answered long before) or once its starter stopped
   waiting (its bounded wait ended first and it answered 202, after telling the task so
   with the signal ``starter_stopped_waiting``; since 0.6.0 not a task its status shows
   waiting for a person, which writes its own anyway).
3. **The next repeat** of the request (same key and fingerprint) that finds the record
   still processing and its task ended writes the task's result: the starter died before
   its write, or the workflow's writes all failed.
4. **The upkeep pass** (``prune_idempotency_records``, run by the prune schedule) writes the
   outcome of every ended task nobody wrote after ``settle_after_seconds``: the starter
   died and no repeat came. A claim its owner never marked started takes the outcome only
   from the task started for its own request (``REQUEST_HASH_MEMO`` in the task's memo).

Which of the first two applies is one field of the task's input,
``AgentTaskInput.outcome_writer`` (``OutcomeWriter``): ``none`` for a task no record
names (started by hand), ``workflow`` for an open task, ``starter`` for a plan or a tool
call started by the gateway. The last two need no setting: they repair what a dead
writer left, whatever the task's input says.
"""

from onceflow.idempotency._memo import REQUEST_HASH_MEMO, STARTED_BY_CLAIM_MEMO
from onceflow.idempotency._outcome import (
    TERMINAL_STATUS_CODE,
    StepView,
    TaskView,
    stored_outcome,
    task_status_url,
    task_view,
)
from onceflow.idempotency._store import (
    PRUNED_RECORDS_CHANNEL,
    AlreadyClaimed,
    Claimed,
    IdempotencyRecord,
    IdempotencyStore,
    NewClaim,
    PruneResult,
    RecordState,
    Unrecorded,
)
from onceflow.workflows.task_models import OutcomeWriter

__all__ = [
    "PRUNED_RECORDS_CHANNEL",
    "REQUEST_HASH_MEMO",
    "STARTED_BY_CLAIM_MEMO",
    "TERMINAL_STATUS_CODE",
    "AlreadyClaimed",
    "Claimed",
    "IdempotencyRecord",
    "IdempotencyStore",
    "NewClaim",
    "OutcomeWriter",
    "PruneResult",
    "RecordState",
    "StepView",
    "TaskView",
    "Unrecorded",
    "stored_outcome",
    "task_status_url",
    "task_view",
]
