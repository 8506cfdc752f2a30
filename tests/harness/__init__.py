"""The one harness tests and benchmarks share: how they start things and how they wait.

Nothing here sleeps to synchronise. What must happen is waited for with
``eventually(read, what=...)``; what must not happen is checked only after a probe has
shown the system went quiet (``workflow_idle``, ``settled_count``, ``passed_marker``, or
a far side's own record, such as the Stripe-compatible provider's ledger). Processes are
started and waited on until they print that they are ready (``spawn`` with
``wait_for_line``, or ``log_line`` for a process writing to a log file). Every such wait
is bounded by ``HANG_SECONDS``, which tells a hang from slow progress, never the work's
pace on a quiet machine.

A ``sleep`` left in a test is part of its scenario (a slow far side, a tool that works
for a while, an agent's retry cadence) and says so on its line; ``env.sleep(...)`` on
Temporal's time-skipping server advances its clock and is a scenario step too.
"""

from ._attempts import attempt_environment
from ._eventually import HANG_SECONDS, eventually, eventually_blocking
from ._processes import (
    REPO,
    log_line,
    log_line_blocking,
    onceflow_command,
    spawn,
    stop,
    wait_for_line,
)
from ._quiescence import (
    is_key_window_timer,
    key_window_closed,
    passed_marker,
    settled_count,
    workflow_idle,
)
from ._replay_all import (
    OTHER_RELEASES,
    ReplayReport,
    StartedWorkflows,
    replay_every_task,
    replay_tools_from,
)
from ._tasks import parked, wait_for

__all__ = [
    "HANG_SECONDS",
    "OTHER_RELEASES",
    "REPO",
    "ReplayReport",
    "StartedWorkflows",
    "attempt_environment",
    "eventually",
    "eventually_blocking",
    "is_key_window_timer",
    "key_window_closed",
    "log_line",
    "log_line_blocking",
    "onceflow_command",
    "parked",
    "passed_marker",
    "replay_every_task",
    "replay_tools_from",
    "settled_count",
    "spawn",
    "stop",
    "wait_for",
    "wait_for_line",
    "workflow_idle",
]
