"""What every actor of a chaos run shares: one :class:`RunContext`.

The agents, the operator, the fault injectors and the checker each take the run's
context: its configuration, random source, tenant, the planned task records, the figures
and violations found so far, the progress counters that pace the faults, the HTTP client
and the stack (processes and addresses).
"""

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import httpx

from .config import UNDECIDABLE_AFTER, ChaosConfig
from .records import TaskRecord
from .recovery import Recovery
from .stack import Stack


class RunContext:
    """One run's shared state: what the actors read, count and append to."""

    def __init__(self, config: ChaosConfig, scratch: Path, say: Callable[[str], None]) -> None:
        self.config = config
        self.scratch = scratch
        self.logs = scratch / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.say = say
        self.rng = random.Random(config.seed)
        self.tenant = f"chaos-{uuid.uuid4().hex[:8]}"
        self.task_queue = f"chaos-{uuid.uuid4().hex[:8]}"
        self.records: list[TaskRecord] = []
        self.figures: Counter[str] = Counter()
        self.durations: dict[str, float] = {}
        self.recovery = Recovery()
        self.submitted = 0
        self.acknowledged = 0
        self.finished = 0
        self.driving = True
        self.progressed = asyncio.Event()
        """Set (and replaced) whenever a task is submitted or ends, or driving stops: the
        nemesis paces its faults by this work, never by the clock."""
        self.started = time.monotonic()
        self.violations: list[str] = []
        self.pauses: list[tuple[datetime, datetime]] = []
        """When each SIGSTOP began and ended (the fault injectors'), for the checker."""
        self.settle_deadline = float("inf")
        """Until when agents keep working once driving is over (see :meth:`settling`)."""
        self.http: httpx.AsyncClient
        """The agents', operator's and fault injectors' client, open while the run runs."""
        self.stack = Stack(self)

    def headers(self, key: str | None = None, *, operator: bool = False) -> dict[str, str]:
        api_key = self.stack.operator_key if operator else self.stack.agent_key
        headers = {"Authorization": f"Bearer {api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    def gateway(self) -> str:
        return self.rng.choice(self.stack.gateway_urls)

    def settling(self) -> bool:
        """Whether agents still work: while driving, then until the settle deadline."""
        return self.driving or time.monotonic() < self.settle_deadline

    def note_progress(self) -> None:
        """Wake everything waiting for work to be done (see ``FaultInjector.until_work``)."""
        self.progressed.set()
        self.progressed = asyncio.Event()

    def only_undecidable_remain(self) -> bool:
        """Every task not ended waits for a decision the run's operator has failed to take
        ``UNDECIDABLE_AFTER`` times in a row (an email whose outcome is unknown after DATA
        and not at the sink: the task refuses did_not_happen without proof). A person
        would take it from here: the run stops waiting and reports them parked at end."""
        return all(
            r.final_state
            or r.refusal
            or not r.acknowledged
            or r.undecided_in_a_row >= UNDECIDABLE_AFTER
            for r in self.records
        )

    def in_flight(self) -> set[int]:
        """The tasks acknowledged and not yet settled."""
        return {r.number for r in self.records if r.acknowledged and not r.final_state}

    def standing(self) -> str:
        """Where the run stands, in one line."""
        done = Counter(r.final_state for r in self.records if r.final_state)
        return (
            f"t={time.monotonic() - self.started:4.0f}s submitted {self.submitted}/"
            f"{self.config.tasks} acknowledged {self.acknowledged} ended "
            f"{sum(done.values())} (succeeded {done['succeeded']}, failed "
            f"{done['failed']}, open tasks closed {done['closed']}) kills "
            f"{self.figures['workers SIGKILLed (each replaced)']}"
            f" pg-kills {self.figures['PostgreSQL connections terminated']}"
            f" provider-faults {self.figures['provider faults injected']}"
            f" smtp-faults {self.figures['SMTP faults injected']}"
        )

    def unfinished(self) -> str:
        """The acknowledged tasks that have not ended, as ``number tool`` (at most 20)."""
        waiting = [
            f"{r.number} {r.tool}" for r in self.records if r.acknowledged and not r.final_state
        ]
        shown = ", ".join(waiting[:20]) + (" ..." if len(waiting) > 20 else "")
        return f"{len(waiting)} acknowledged tasks not ended: {shown or 'none'}"

    async def progress(self) -> None:
        while True:
            await asyncio.sleep(self.config.progress_every)  # the progress report's cadence
            self.say(self.standing())
