"""One chaos run from start to end: plan, stack up, agents and faults, settle, check.

:func:`run_chaos` is what ``tests/chaos/test_chaos.py`` calls at CI size and what
``python -m tests.chaos.harness`` runs at any size.
"""

import asyncio
import contextlib
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.harness import eventually

from .agents import Agents
from .checker import Checker
from .config import ChaosConfig
from .context import RunContext
from .faults import FaultInjector
from .operators import Operator
from .plan import plan
from .records import ChaosReport, ChaosTimeout


class ChaosRun:
    """One run: the stack, the agents, the nemesis and the final check."""

    def __init__(self, config: ChaosConfig, scratch: Path, say: Callable[[str], None]) -> None:
        self.ctx = RunContext(config, scratch, say)
        self.stack = self.ctx.stack
        self.agents = Agents(self.ctx, Operator(self.ctx))
        self.faults = FaultInjector(self.ctx)
        self.checker = Checker(self.ctx)

    async def run(self) -> ChaosReport:
        """The whole run, stopped with :class:`ChaosTimeout` past the time limit (a safety
        net: the run ends as soon as its tasks have settled and been checked)."""
        self.ctx.records += plan(self.ctx.config, self.ctx.rng)
        limits = httpx.Limits(max_connections=self.ctx.config.concurrency * 3)
        try:
            async with asyncio.timeout(self.ctx.config.time_limit):
                async with (
                    self.stack.running(),
                    httpx.AsyncClient(timeout=15, limits=limits) as self.ctx.http,
                ):
                    return await self.chaos()
        except TimeoutError:
            # A gateway that never came back slows the agents into the limit: the
            # violations found by then say why.
            found = "; ".join(self.ctx.violations[:5]) or "none"
            where = (
                f"{self.ctx.standing()}; {self.ctx.unfinished()}; "
                f"{len(self.ctx.violations)} violations so far: {found}"
            )
            self.ctx.say(f"time limit of {self.ctx.config.time_limit:g} s passed: {where}")
            raise ChaosTimeout(
                f"the chaos run passed its time limit of {self.ctx.config.time_limit:g} s"
                f" ({where}); the processes' logs are in {self.ctx.logs}"
            ) from None

    async def chaos(self) -> ChaosReport:
        background: list[asyncio.Task[Any]] = []
        try:
            return await self.drive_and_check(background)
        finally:
            for task in background:  # a time limit or an error must not leave them running
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)

    async def drive_and_check(self, background: list[asyncio.Task[Any]]) -> ChaosReport:
        self.ctx.settle_deadline = float("inf")
        self.started_driving = time.monotonic()
        progress = asyncio.create_task(self.ctx.progress())
        supervisor = asyncio.create_task(self.stack.supervise_workers())
        driving = asyncio.create_task(self.agents.drive())
        config = self.ctx.config
        faults = self.faults
        nemesis = [
            asyncio.create_task(faults.every(config.kill_every_tasks, faults.kill_a_worker)),
            asyncio.create_task(faults.every(config.fault_every_tasks, faults.provider_fault)),
            asyncio.create_task(faults.every(config.fault_every_tasks, faults.smtp_fault)),
            asyncio.create_task(faults.every(config.pg_kill_every_tasks, faults.kill_connections)),
            asyncio.create_task(
                faults.every(config.gateway_kill_every_tasks, faults.kill_a_gateway)
            ),
            asyncio.create_task(faults.pause_a_worker_once()),
            asyncio.create_task(faults.restart_temporal_once()),
            asyncio.create_task(faults.restart_postgres_once()),
        ]
        background += [progress, supervisor, driving, *nemesis]
        await eventually(
            lambda: (
                self.ctx.acknowledged + sum(1 for r in self.ctx.records if r.refusal)
                >= max(self.ctx.config.tasks, 1)
                or driving.done()
            ),
            what="every task is acknowledged or refused",
            timeout=math.inf,
            interval=0.2,
        )
        # Every task has been acknowledged: stop breaking things, let them end.
        self.ctx.driving = False
        self.ctx.note_progress()
        self.ctx.settle_deadline = time.monotonic() + self.ctx.config.settle_seconds
        await asyncio.gather(*nemesis)
        await self.faults.heal()
        self.ctx.durations["chaos phase (s)"] = round(time.monotonic() - self.started_driving, 1)
        self.ctx.say("faults healed; waiting for the remaining tasks to end")
        await eventually(
            lambda: driving.done() or self.ctx.only_undecidable_remain(),
            what="every task ended, or waits for a decision the run cannot take",
            timeout=math.inf,
            interval=0.5,
        )
        self.ctx.settle_deadline = min(self.ctx.settle_deadline, time.monotonic())
        await driving
        self.ctx.durations["driving incl. settling (s)"] = round(
            time.monotonic() - self.started_driving, 1
        )
        progress.cancel()
        # Replacement workers still starting must be up, so queries are answered.
        for worker in list(self.stack.workers):
            with contextlib.suppress(RuntimeError):
                await worker.ready("onceflow worker ready")
        try:
            return await self.checker.check()
        finally:
            supervisor.cancel()


async def run_chaos(
    config: ChaosConfig, *, scratch: Path | None = None, say: Callable[[str], None] = print
) -> ChaosReport:
    """Run the chaos run once and return its report (``report.ok`` when it passed)."""
    if scratch is not None:
        return await ChaosRun(config, scratch, lambda line: say(line)).run()
    with tempfile.TemporaryDirectory(prefix="onceflow-chaos-") as directory:
        return await ChaosRun(config, Path(directory), say).run()
