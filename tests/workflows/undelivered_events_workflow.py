"""A workflow whose first call waits on a timer: the smallest task that takes Updates while
no worker polls (``test_undelivered_events.py``)."""

from dataclasses import dataclass
from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def answer(n: int) -> int:
    return n


@dataclass
class Seen:
    calls: int
    timer_fired: bool


@workflow.defn
class CallsAfterATimer:
    def __init__(self) -> None:
        self._calls = 0
        self._timer_fired = False
        self._finished = False

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self._finished and workflow.all_handlers_finished())
        return self._calls

    @workflow.update
    async def call(self, wait_seconds: float) -> int:
        self._calls += 1
        mine = self._calls
        if wait_seconds:
            await workflow.sleep(timedelta(seconds=wait_seconds))
            self._timer_fired = True
        return await workflow.execute_activity(
            answer, mine, start_to_close_timeout=timedelta(seconds=30)
        )

    @workflow.query
    def seen(self) -> Seen:
        return Seen(calls=self._calls, timer_fired=self._timer_fired)

    @workflow.signal
    def finish(self) -> None:
        self._finished = True
