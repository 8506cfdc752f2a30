"""Every patch ``AgentTaskWorkflow`` holds, and when each may go.

A change to the commands the workflow issues on a path a running task may still take
(an open task, a parked step, a call awaiting approval: they wait for weeks) ships
behind ``workflow.patched(id)`` with its id registered here; tasks started before the
release replay the old branch, new ones record the marker and take the new one. A
patch retires in two releases, each only once the condition holds (docs/production.md,
"Ship a workflow change"): ``workflow.deprecate_patch(id)`` replaces the branch once no
task that started without the marker is open, then the call goes once none that recorded
it through ``patched`` is open either.

Releases are listed in CHANGELOG.md. 0.1.0 (f891336) recorded the ids registered with
``since="0.1.0"``; its tasks (parked, awaiting approval, open: they wait for weeks) are
run by the rules of 0.1.0 wherever a later release changed the commands a task issues
(``TaskRun.started_on_0_1_0``), and the ids it recorded stay in the code, deprecated,
until no task it started is open. 0.2.0 (485d7db) records no marker at a task's start;
its tasks took the ids it brought (``since="0.2.0"``) where a decision resumed them, and
its saved histories hold those markers.
"""

from dataclasses import dataclass
from typing import Literal

CURRENT_RELEASE = "0.6.0"
"""The release this code is (CHANGELOG.md); its saved histories are
``tests/workflows/histories/*.json``, an earlier release's ``histories/releases/V/``."""


@dataclass(frozen=True)
class Patch:
    """One registered patch id."""

    id: str
    change: str
    """What the new branch does differently, in one sentence."""
    since: str
    """The first release that records it."""
    stage: Literal["patched", "deprecated"]
    """``patched``: the code branches on it; ``deprecated``: the code only accepts the
    marker where a task of an earlier release recorded it."""
    retire_when: str
    """The condition under which the next step of its retirement may ship."""


OUTCOME_AFTER_DURABLE_DECISION = "outcome-after-durable-decision"
DECISION_DURABLE_BEFORE_ACTING = "decision-durable-before-acting"
NO_WAIT_AFTER_LAST_OUTCOME_WRITE = "no-wait-after-last-outcome-write"

START_PATCHES_FOLDED = "start-patches-folded-outcome-recorded-locally"
KEY_GENERATIONS = "key-generations"
OLD_KEY_SETTLES = "new-key-after-old-key-settles"
DATABASE_WAITS = "database-outage-attempts-are-free"
UNVERIFIED_RECORDED = "unverified-happened-recorded"
UNREGISTERED_ACTIVITY_IS_TRANSIENT = "unregistered-activity-is-transient"
POLICIES_CARRIED = "policies-carried-no-pin"
OPEN_TASK_FEWER_ACTIONS = "open-task-fewer-actions"

_RETIRE_0_1_0 = (
    "remove once no task started on 0.1.0 is open (docs/production.md, the count query "
    "with StartTime before the deploy of 0.2.0)"
)

PATCHES: tuple[Patch, ...] = (
    Patch(
        id=START_PATCHES_FOLDED,
        change=(
            "Recorded by every task 0.1.0 started, first thing: how a task is known to run "
            "by the rules of 0.1.0."
        ),
        since="0.1.0",
        stage="deprecated",
        retire_when=_RETIRE_0_1_0,
    ),
    Patch(
        id=KEY_GENERATIONS,
        change=(
            "did_not_happen on a step whose key can no longer be sent authorises an attempt "
            "under the next key generation."
        ),
        since="0.1.0",
        stage="deprecated",
        retire_when=_RETIRE_0_1_0,
    ),
    Patch(
        id=OLD_KEY_SETTLES,
        change=(
            "A new key generation past the old key's send-by waits for the old key's "
            "requests to settle and looks the effect up again."
        ),
        since="0.1.0",
        stage="deprecated",
        retire_when=_RETIRE_0_1_0,
    ),
    Patch(
        id=DATABASE_WAITS,
        change="An attempt that ended because onceflow's database was down is not charged.",
        since="0.1.0",
        stage="deprecated",
        retire_when=_RETIRE_0_1_0,
    ),
    Patch(
        id=UNVERIFIED_RECORDED,
        change="A happened accepted unverified is handed to the look-up, which records it.",
        since="0.1.0",
        stage="deprecated",
        retire_when=_RETIRE_0_1_0,
    ),
    Patch(
        id=UNREGISTERED_ACTIVITY_IS_TRANSIENT,
        change="An attempt no worker could run (its activity not registered) ran nothing.",
        since="0.1.0",
        stage="deprecated",
        retire_when=_RETIRE_0_1_0,
    ),
    Patch(
        id=OUTCOME_AFTER_DURABLE_DECISION,
        change=(
            "A task ended by a decision Update (approve, reconcile, close) in the workflow "
            "task that admitted it starts a 1 ms timer before recording its outcome, so the "
            "record is never written for a decision history does not hold yet."
        ),
        since="0.2.0",
        stage="patched",
        retire_when=(
            "deprecate once no task started before 0.2.0 is open; remove once none started "
            "before the release that deprecated it is open"
        ),
    ),
    Patch(
        id=DECISION_DURABLE_BEFORE_ACTING,
        change=(
            "A step resumed by an approval or reconciliation Update accepted in the current "
            "workflow task starts a 1 ms timer before it acts, so the decision and its answer "
            "are in history before anything that may fail the workflow task (an attempt of a "
            "tool this worker lacks)."
        ),
        since="0.2.0",
        stage="patched",
        retire_when=(
            "deprecate once no task started before 0.2.0 is open; remove once none started "
            "before the release that deprecated it is open"
        ),
    ),
    Patch(
        id=NO_WAIT_AFTER_LAST_OUTCOME_WRITE,
        change=(
            "A task whose every write of its outcome failed ends after the last one, "
            "instead of first waiting out a backoff (32 s) that no write follows."
        ),
        since="0.3.0",
        stage="patched",
        retire_when=(
            "deprecate once no task started before the release that brought it can be "
            "waiting out that backoff (it ends 32 s after its last write failed); remove "
            "once none started before the release that deprecated it is open"
        ),
    ),
    Patch(
        id=POLICIES_CARRIED,
        change=(
            "A plan started without its tools' policies fails at its first workflow task "
            "(StartedWithoutPolicies), and a call of a tool the task has not pinned uses "
            "the policy it carries, instead of pinning either with the local activity "
            "pin_task_policy (workflows/_retired_policy_pin.py)."
        ),
        since="0.3.0",
        stage="patched",
        retire_when=(
            "deprecate once no task started before the release that brought it is open "
            "(the count query with StartTime before its deploy): until then a 0.1.0 or "
            "0.2.0 task started without policies replays the pin, and a 0.1.0 open task "
            "pins a new call's tool live, so workers keep registering pin_task_policy; "
            "remove once none started before the release that deprecated it is open, "
            "with PolicyPinning, PIN_TASK_POLICY, PinPolicyInput and TaskPolicy"
        ),
    ),
    Patch(
        id=OPEN_TASK_FEWER_ACTIONS,
        change=(
            "An open task started with its tenant, kind and state as start attributes "
            "(TaskClient, since 0.4.0) upserts none at its first workflow task, and one "
            "timer runs through its calls for its idle or lifetime end, re-armed only when "
            "it fires early, instead of a new timer after every call (Temporal Cloud bills "
            "each upsert and each timer)."
        ),
        since="0.4.0",
        stage="patched",
        retire_when=(
            "deprecate once no open task started before the release that brought it is "
            "open; remove once none started before the release that deprecated it is open"
        ),
    ),
)
"""The patches in the workflow code, oldest first. The replay test checks that every
``workflow.patched`` and ``deprecate_patch`` id is registered, that a patched one has
saved histories on both of its sides, and that every marker a supported release's saved
histories hold is still accepted by the code."""
