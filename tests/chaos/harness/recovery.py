"""How soon a chaos run recovers from each kind of fault.

From the moment a fault ends (a worker SIGKILLed and its replacement started, a SIGSTOPped
worker resumed, Temporal or PostgreSQL back), two times: until an agent's next request
succeeds through a gateway, and until the last task in flight at that moment that ended
did (a task still parked at the run's end, reported as such, is left out).
"""

import statistics
import time
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field


@dataclass
class _Fault:
    kind: str
    ended: float
    in_flight: set[Hashable]
    first_success: float | None = None
    last_settled: float | None = None


@dataclass
class Recovery:
    """Fault ends, successful answers and settled tasks, on the monotonic clock."""

    faults: list[_Fault] = field(default_factory=list)
    settled_at: dict[Hashable, float] = field(default_factory=dict)

    def answered(self, status_code: int) -> None:
        if 200 <= status_code < 300:
            now = time.monotonic()
            for fault in self.faults:
                if fault.first_success is None:
                    fault.first_success = now

    def settled(self, task: Hashable) -> None:
        self.settled_at.setdefault(task, time.monotonic())

    def fault_ended(self, kind: str, in_flight: set[Hashable]) -> None:
        self.faults.append(_Fault(kind, time.monotonic(), set(in_flight)))

    def figures(self) -> dict[str, float]:
        """Per fault kind: how many, and the median and worst of each recovery time (s)."""
        by_kind: dict[str, list[_Fault]] = defaultdict(list)
        for fault in self.faults:
            by_kind[fault.kind].append(fault)
        figures: dict[str, float] = {}
        for kind, faults in sorted(by_kind.items()):
            firsts = [f.first_success - f.ended for f in faults if f.first_success is not None]
            settles = [
                max(
                    (self.settled_at[t] for t in f.in_flight if t in self.settled_at),
                    default=f.ended,
                )
                - f.ended
                for f in faults
            ]
            figures[f"recovery: {kind}: faults"] = len(faults)
            for name, times in (("first success", firsts), ("in flight ended", settles)):
                if times:
                    figures[f"recovery: {kind}: {name}, median (s)"] = round(
                        statistics.median(times), 2
                    )
                    figures[f"recovery: {kind}: {name}, worst (s)"] = round(max(times), 2)
        return figures
