"""The send windows of steps' keys: for a tool whose provider forgets keys, how long a
key may still be sent, decided by a timer started with the key's first attempt."""

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    # Summaries are identifiers only: readable in the UI when payloads are encrypted.
    from onceflow.encryption import ClearText
    from onceflow.tools.worker import ToolPolicy
    from onceflow.workflows.task_models import AttemptRecord, StepStatus
from onceflow.workflows._task_book import TaskBook
from onceflow.workflows._task_run import KeyWindow


class KeyWindows:
    """Opens, stops and reads each running step's key window (``TaskRun.key_windows``)."""

    # One per cached task: slots, no attribute dict to hold.
    __slots__ = ("_book", "_run")

    def __init__(self, book: TaskBook) -> None:
        self._book = book
        self._run = book.run

    def first_attempt_of_key(self, status: StepStatus) -> AttemptRecord | None:
        """The first attempt sent under the step's current key generation, if any."""
        return next((a for a in status.attempts if a.key_generation == status.key_generation), None)

    def send_by(self, policy: ToolPolicy, status: StepStatus) -> datetime | None:
        """The step key's send-by deadline in workflow time, if the provider forgets keys:
        for messages and the attempt's schedule-to-start limit only, never a decision
        (the key window's timer decides).

        Counted from the start of the key generation's first attempt, which is no later
        than the key's first send: earlier than the attempt's own check (the recorded
        first send), never later.
        """
        first = self.first_attempt_of_key(status)
        if first is None:
            return None
        return policy.send_by(first.started_at)

    def open_for(self, policy: ToolPolicy, status: StepStatus) -> None:
        """Start the key's window timer with its first attempt: the window closes when it
        fires (an event in history), so every decision about the window replays. It is
        started before the attempt can send, so it closes no later than the attempt's
        own check (against the database's first-send time) refuses to send."""
        window = policy.send_window
        current = self._run.key_windows.get(status.step_id)
        if window is None or (current is not None and current.generation == status.key_generation):
            return
        if self._run.started_on_0_1_0:
            return  # 0.1.0 compared the clock with the key's send-by instead
        self.stop(status.step_id)
        self._run.key_windows[status.step_id] = KeyWindow(
            generation=status.key_generation,
            timer=asyncio.create_task(
                workflow.sleep(
                    window,
                    summary=ClearText(f"send window of step {status.step_id}'s key"),
                )
            ),
        )

    def stop(self, step_id: str) -> None:
        """Stop the step's window timer, if one runs: the window matters only while the
        step may still send under its key."""
        window = self._run.key_windows.pop(step_id, None)
        if window is not None and not window.timer.done():
            window.timer.cancel()

    def is_open(self, status: StepStatus) -> bool:
        """False once the window timer of the step's current key fired."""
        window = self._run.key_windows.get(status.step_id)
        return not (
            window is not None
            and window.generation == status.key_generation
            and window.timer.done()
            and not window.timer.cancelled()
        )

    def safe_repeat_window(self, policy: ToolPolicy, status: StepStatus) -> timedelta | None:
        """The policy's safe repeat window, from the key window's timer: nothing left once
        it fired, else at most the whole window (a retry whose backoff outlasts what is
        left finds the timer fired after it, and looks up instead of sending)."""
        key_age = timedelta(0)
        if self._run.started_on_0_1_0:
            first = self.first_attempt_of_key(status) or status.attempts[0]
            key_age = workflow.now() - first.started_at
        elif not self.is_open(status) and policy.send_window is not None:
            key_age = policy.send_window
        return policy.safe_repeat_window(key_age)

    def old_key_unusable(self, status: StepStatus) -> bool:
        """Whether the step's current key can no longer be sent: an attempt said so, or
        its window closed (while the step waited for a person, say)."""
        if status.step_id in self._run.unusable_keys:
            return True
        policy = self._book.policy(status.tool)
        if self._run.started_on_0_1_0:
            return self.send_by_passed_on_0_1_0(policy, status) is not None
        return self.why_closed(policy, status) is not None

    def why_closed(self, policy: ToolPolicy, status: StepStatus) -> str | None:
        """Why nothing may be sent under the step's key any more, once its window closed."""
        if self.is_open(status):
            return None
        send_by = self.send_by(policy, status)
        when = f", about {send_by.isoformat(timespec='seconds')}" if send_by is not None else ""
        return (
            f"the send window of the step's key closed (first attempt + retention "
            f"{policy.key_retention} - margin {policy.retention_margin}{when}): the provider "
            "may have forgotten the key, so nothing more is sent under it"
        )

    def send_by_passed_on_0_1_0(self, policy: ToolPolicy, status: StepStatus) -> str | None:
        """0.1.0's check of the key's send-by, by the clock (its tasks keep it)."""
        send_by = self.send_by(policy, status)
        if send_by is None or workflow.now() < send_by:
            return None
        return (
            f"the send-by deadline of the step's key ({send_by.isoformat(timespec='seconds')}: "
            f"first attempt + retention {policy.key_retention} - margin "
            f"{policy.retention_margin}) passed while the retry waited (its backoff, or a "
            "stopped or backlogged worker): the provider may have forgotten the key, so "
            "nothing was sent again"
        )
