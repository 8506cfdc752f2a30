"""How soon a chaos run recovers from each kind of fault.

From the moment a fault ends (a worker or a gateway SIGKILLed and its replacement
started, a SIGSTOPped worker resumed, Temporal or PostgreSQL back), two times: until an
agent's next request succeeds through a gateway, and until the last task in flight at
that moment that ended did (a task still parked at the run's end, reported as such, is
left out). After the faults whose gateways are watched (PostgreSQL's return, a gateway's
restart), two more: until ``GET /readyz`` answered 200 on every gateway, and until each
gateway answered a real request 2xx (the latest of the gateways, each time). A gateway
that never does is a violation the fault injectors report, not a time here.
"""

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

MEASURES = (
    "first success",
    "in flight ended",
    "every gateway ready",
    "first 2xx on each gateway",
)
"""The recovery times, each figure named ``recovery: KIND: MEASURE, median (s)`` (and
``worst (s)``), with ``recovery: KIND: faults``."""


@dataclass
class GatewayReturn:
    """When one gateway was back after a fault (monotonic clock; None: not yet)."""

    ready: float | None = None
    """Its first ``GET /readyz`` 200."""
    first_2xx: float | None = None
    """Its first 2xx to a real request (an agent's, or the run's own replay of a key)."""


@dataclass
class FaultEnd:
    """One fault's end and what recovered after it."""

    kind: str
    ended: float
    in_flight: set[Hashable]
    first_success: float | None = None
    gateways: dict[str, GatewayReturn] = field(default_factory=dict)
    """Per gateway address, for the faults whose gateways are watched."""


@dataclass
class Recovery:
    """Fault ends, successful answers and settled tasks, on the monotonic clock."""

    faults: list[FaultEnd] = field(default_factory=list)
    settled_at: dict[Hashable, float] = field(default_factory=dict)

    def answered(self, status_code: int, gateway: str) -> None:
        """An agent's request got an answer from ``gateway``."""
        if 200 <= status_code < 300:
            now = time.monotonic()
            for fault in self.faults:
                if fault.first_success is None:
                    fault.first_success = now
            self.gateway_answered(status_code, gateway)

    def gateway_answered(self, status_code: int, gateway: str) -> None:
        """``gateway`` answered a real request (an agent's or the run's own)."""
        if 200 <= status_code < 300:
            now = time.monotonic()
            for fault in self.faults:
                watched = fault.gateways.get(gateway)
                if watched is not None and watched.first_2xx is None:
                    watched.first_2xx = now

    def gateway_ready(self, fault: FaultEnd, gateway: str) -> None:
        fault.gateways[gateway].ready = time.monotonic()

    def settled(self, task: Hashable) -> None:
        self.settled_at.setdefault(task, time.monotonic())

    def fault_ended(
        self, kind: str, in_flight: Iterable[Hashable], gateways: Iterable[str] = ()
    ) -> FaultEnd:
        """Record a fault's end; ``gateways``: the addresses whose return is watched."""
        fault = FaultEnd(kind, time.monotonic(), set(in_flight))
        fault.gateways = {gateway: GatewayReturn() for gateway in gateways}
        self.faults.append(fault)
        return fault

    def figures(self) -> dict[str, float]:
        """Per fault kind: how many, and the median and worst of each recovery time (s)."""
        by_kind: dict[str, list[FaultEnd]] = defaultdict(list)
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
            measured = (
                firsts,
                settles,
                _every_gateway(faults, lambda back: back.ready),
                _every_gateway(faults, lambda back: back.first_2xx),
            )
            for name, times in zip(MEASURES, measured, strict=True):
                if times:
                    figures[f"recovery: {kind}: {name}, median (s)"] = round(
                        statistics.median(times), 2
                    )
                    figures[f"recovery: {kind}: {name}, worst (s)"] = round(max(times), 2)
        return figures


def _every_gateway(
    faults: list[FaultEnd], moment: Callable[[GatewayReturn], float | None]
) -> list[float]:
    """Per watched fault whose every gateway got there: until the last one did."""
    times = []
    for fault in faults:
        moments = [moment(back) for back in fault.gateways.values()]
        reached = [m for m in moments if m is not None]
        if moments and len(reached) == len(moments):
            times.append(max(reached) - fault.ended)
    return times
