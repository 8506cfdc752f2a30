"""Every patch ``AgentTaskWorkflow`` holds, and when each may go.

A change to the commands the workflow issues on a path a running task may still take
(an open task, a parked step, a call awaiting approval: they wait for weeks) ships
behind ``workflow.patched(id)`` with its id registered here; tasks started before the
release replay the old branch, new ones record the marker and take the new one. A
patch retires in two releases, each only once the condition holds (docs/production.md,
"Ship a workflow change"): ``workflow.deprecate_patch(id)`` replaces the branch once no
task that started without the marker is open, then the call goes once none that recorded
it through ``patched`` is open either.

0.1.0 is the baseline: the patches of its pre-release development were folded into it
(no user's task ran before it).
"""

from dataclasses import dataclass

BASELINE = "0.1.0"
"""The release whose workflow code every saved history without a patch marker replays."""


@dataclass(frozen=True)
class Patch:
    """One registered patch id."""

    id: str
    change: str
    """What the new branch does differently, in one sentence."""
    since: str
    """The first release that records it."""
    retire_when: str
    """The condition under which the next step of its retirement may ship."""


OUTCOME_AFTER_DURABLE_DECISION = "outcome-after-durable-decision"


PATCHES: tuple[Patch, ...] = (
    Patch(
        id=OUTCOME_AFTER_DURABLE_DECISION,
        change=(
            "A task ended by a decision Update (approve, reconcile, close) in the workflow "
            "task that admitted it starts a 1 ms timer before recording its outcome, so the "
            "record is never written for a decision history does not hold yet."
        ),
        since="0.2.0",
        retire_when=(
            "deprecate once no task started before 0.2.0 is open; remove once none started "
            "before the release that deprecated it is open"
        ),
    ),
)
"""The patches in the workflow code, oldest first. The replay test checks that every
``workflow.patched`` id is registered and has saved histories on both of its sides."""
