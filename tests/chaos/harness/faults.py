"""The chaos run's fault injectors (the nemesis), paced by the tasks that end.

While agents drive the tasks: SIGKILL of a ready worker (a replacement is started each
time), provider faults (responses dropped or delayed after the commit, resets,
429/500/503), SMTP faults (connection dropped after DATA with the message kept or lost,
delayed replies, deferred recipients), ``pg_terminate_backend`` on onceflow's PostgreSQL
connections, and faults that never overlap: a gateway SIGKILLed and replaced on its port
(the two in turn), and three one-offs: a worker SIGSTOPped for longer than the provider
keeps payment keys then SIGCONTed, one restart of the Temporal dev server, one restart of
PostgreSQL held down ``POSTGRES_OUTAGE_SECONDS`` under load. After a gateway's restart and
PostgreSQL's, every gateway must be ready and answer a real request 2xx again within
``HANG_SECONDS``, or the run reports a violation naming the gateway. Never paced by the
clock, so a slower machine meets the same faults per task. Once driving is over,
:meth:`FaultInjector.heal` clears the far sides' pending faults.
"""

import asyncio
import contextlib
import functools
import math
import signal
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import psycopg

from tests.harness import HANG_SECONDS, eventually

from .config import (
    GATEWAY_PROBE_TIMEOUT,
    KEY_RETENTION_SECONDS,
    MAX_PENDING_FAULTS,
    OPEN_TASK,
    PAUSE_SECONDS,
    POSTGRES_OUTAGE_SECONDS,
    PROVIDER_FAULTS,
    SMTP_FAULTS,
)
from .context import RunContext
from .records import TaskRecord
from .recovery import FaultEnd
from .stack import Process

GATEWAY_KILLS = "gateways SIGKILLed (each replaced on its port)"


class FaultInjector:
    """Breaks the stack while agents drive it; each fault is counted in the figures."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.stack = ctx.stack
        self.one_off = asyncio.Lock()
        """Held by each one-off fault (SIGSTOP, Temporal restart, PostgreSQL restart) and
        each gateway SIGKILL until every gateway is back, so they never overlap and each
        one's effects can be told apart (a gateway cannot start while PostgreSQL is
        down)."""
        self.paused: Process | None = None
        self.postgres_down = False

    async def until_work(self, done: Callable[[], bool]) -> bool:
        """Wait until ``done()`` holds, checked each time a task is submitted or ends;
        False if driving stopped first."""
        while self.ctx.driving and not done():
            await self.ctx.progressed.wait()
        return self.ctx.driving

    async def every(self, tasks: int, action: Callable[[], Any]) -> None:
        """Run ``action`` each time another ``tasks`` tasks have ended, while driving.

        Paced by work, not by the clock: on a machine half as fast the same tasks meet
        the same faults, instead of twice as many kills per task.
        """
        if tasks <= 0:
            return
        mark = tasks
        while await self.until_work(functools.partial(self.ended_at_least, mark)):
            try:
                await action()
            except Exception as error:  # a failed injection is reported, never fatal
                self.ctx.figures[f"injections that failed ({type(error).__name__})"] += 1
            mark = self.ctx.finished + tasks

    def ended_at_least(self, count: int) -> bool:
        return self.ctx.finished >= count

    def ready_workers(self) -> list[Process]:
        """Running workers that said they are ready, except a SIGSTOPped one."""
        return [
            w
            for w in self.stack.workers
            if w is not self.paused and w.process.poll() is None and "ready" in w.log()
        ]

    def killable_workers(self) -> list[Process]:
        """Ready workers, none while one is SIGSTOPped: the stopped worker is that
        moment's fault, and the other one must run."""
        return [] if self.paused is not None else self.ready_workers()

    async def kill_a_worker(self) -> None:
        """SIGKILL a ready worker (waiting for one: a replacement still starting, or
        Temporal restarting, has none) and start its replacement."""
        ready = await eventually(
            lambda: [] if not self.ctx.driving else self.killable_workers(),
            until=lambda ready: not self.ctx.driving or bool(ready),
            what="a worker is ready to be killed",
            timeout=math.inf,
            interval=0.2,
        )
        if not ready:
            return
        victim = self.ctx.rng.choice(ready)
        victim.kill()
        self.stack.workers.remove(victim)
        self.ctx.figures["workers SIGKILLed (each replaced)"] += 1
        self.stack.start_worker()
        self.ctx.recovery.fault_ended("worker SIGKILL", self.ctx.in_flight())

    async def provider_fault(self) -> None:
        pending = (await self.ctx.http.get(f"{self.stack.far['provider_url']}/_test/faults")).json()
        if len(pending["data"]) >= MAX_PENDING_FAULTS:
            return  # faults are consumed by traffic; never let a backlog fault every request
        fault, delay = self.ctx.rng.choice(PROVIDER_FAULTS)
        await self.ctx.http.post(
            f"{self.stack.far['provider_url']}/_test/faults",
            json={
                "fault": fault,
                "method": "POST",
                "path_prefix": "/v1/",
                "times": 1,
                "delay_seconds": delay,
            },
        )
        self.ctx.figures["provider faults injected"] += 1

    async def smtp_fault(self) -> None:
        pending = (await self.ctx.http.get(f"{self.stack.far['smtp_control_url']}/messages")).json()
        if len(pending["faults"]) >= MAX_PENDING_FAULTS:
            return
        rule = dict(self.ctx.rng.choice(SMTP_FAULTS))
        await self.ctx.http.post(f"{self.stack.far['smtp_control_url']}/faults", json=rule)
        self.ctx.figures["SMTP faults injected"] += 1

    async def kill_connections(self) -> None:
        if self.postgres_down:
            return
        async with await psycopg.AsyncConnection.connect(
            self.stack.database_url, autocommit=True
        ) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend' AND random() < 0.5"
            )
            row = await cursor.fetchone()
        self.ctx.figures["PostgreSQL connections terminated"] += int(row[0]) if row else 0
        self.ctx.figures["pg_terminate_backend rounds"] += 1

    async def submitted_share(self, share: float) -> bool:
        """Wait until ``share`` of the tasks are submitted; False if driving ended first."""
        await eventually(
            lambda: not self.ctx.driving or self.ctx.submitted >= share * self.ctx.config.tasks,
            what=f"{share:.0%} of the tasks are submitted",
            timeout=math.inf,
            interval=0.2,
        )
        return self.ctx.driving

    async def pause_a_worker_once(self) -> None:
        """SIGSTOP a worker for longer than the provider's key retention, then SIGCONT it.

        Its frozen attempts (and the tasks Temporal hands its pollers meanwhile) time out
        and are retried by the other worker within their keys' send-by windows, or looked
        up and parked past them; when it resumes, whatever it was about to send is past
        its key's window and must not leave (the provider's request log is the judge).
        """
        share = self.ctx.config.pause_worker_at
        if share is None or not await self.submitted_share(share):
            return
        async with self.one_off:
            if not self.ctx.driving:
                return
            ready = await eventually(
                self.ready_workers, what="a worker is ready to be stopped", timeout=60
            )
            victim = self.ctx.rng.choice(ready)
            self.ctx.say(
                f"SIGSTOP {victim.name} for {PAUSE_SECONDS:g} s (payment keys are kept "
                f"{KEY_RETENTION_SECONDS:g} s)"
            )
            self.paused = victim
            began = datetime.now().astimezone()
            victim.process.send_signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(PAUSE_SECONDS)  # scenario: the key window passes meanwhile
            finally:
                with contextlib.suppress(ProcessLookupError):
                    victim.process.send_signal(signal.SIGCONT)
                self.paused = None
            self.ctx.pauses.append((began, datetime.now().astimezone()))
            self.ctx.recovery.fault_ended("worker SIGSTOP", self.ctx.in_flight())
            self.ctx.figures["workers SIGSTOPped past a key window"] += 1
            self.ctx.say(f"SIGCONT {victim.name}")

    async def restart_temporal_once(self) -> None:
        share = self.ctx.config.restart_temporal_at
        if share is None or not await self.submitted_share(share):
            return
        async with self.one_off:
            if not self.ctx.driving:
                return
            self.ctx.say("restarting the Temporal dev server (state kept in its db file)")
            began = time.monotonic()
            await asyncio.to_thread(self.stack.temporal.stop)
            await self.stack.temporal.start()
            self.ctx.figures["Temporal dev server restarts"] += 1
            self.ctx.durations["Temporal downtime (s)"] = round(time.monotonic() - began, 1)
            self.ctx.recovery.fault_ended("Temporal restart", self.ctx.in_flight())
            self.ctx.say(f"Temporal back after {time.monotonic() - began:.1f} s")

    async def gateway_answers(self) -> list[int]:
        """Each gateway's status for an authenticated read (it needs PostgreSQL); 0 for
        no answer."""

        async def ask(url: str) -> int:
            try:
                response = await self.ctx.http.get(f"{url}/v1/tools", headers=self.ctx.headers())
            except httpx.HTTPError:
                return 0
            return response.status_code

        return list(await asyncio.gather(*(ask(url) for url in self.stack.gateway_urls)))

    async def restart_postgres_once(self) -> None:
        """Stop PostgreSQL under load (fast shutdown: every session is ended), keep it down
        ``POSTGRES_OUTAGE_SECONDS`` while the agents keep sending, and at least until both
        gateways answer 503 for it, then start it again on the same data folder and socket;
        every gateway must then come back (:meth:`gateways_back`)."""
        share = self.ctx.config.restart_postgres_at
        if share is None or not await self.submitted_share(share):
            return
        async with self.one_off:
            if not self.ctx.driving:
                return
            self.ctx.say(f"stopping PostgreSQL for {POSTGRES_OUTAGE_SECONDS:g} s")
            began = time.monotonic()
            self.postgres_down = True
            try:
                await asyncio.to_thread(self.stack.pg_ctl, "-w", "-m", "fast", "stop")
                try:
                    await eventually(
                        self.gateway_answers,
                        until=lambda codes: all(code == 503 for code in codes),
                        what="both gateways answer 503 while PostgreSQL is down",
                        interval=0.2,
                    )
                except AssertionError as error:
                    self.ctx.violations.append(f"PostgreSQL outage: {error}")
                # scenario: the outage lasts this long while agents keep sending
                await asyncio.sleep(max(0.0, began + POSTGRES_OUTAGE_SECONDS - time.monotonic()))
            finally:
                await asyncio.to_thread(self.stack.start_postgres)
                self.postgres_down = False
            fault = self.ctx.recovery.fault_ended(
                "PostgreSQL restart", self.ctx.in_flight(), self.stack.gateway_urls
            )
            self.ctx.figures["PostgreSQL restarts"] += 1
            self.ctx.durations["PostgreSQL downtime (s)"] = round(time.monotonic() - began, 1)
            self.ctx.say(f"PostgreSQL back after {time.monotonic() - began:.1f} s")
            await self.gateways_back(fault, "the PostgreSQL restart")

    async def kill_a_gateway(self) -> None:
        """SIGKILL a gateway under load (the two in turn) and start its replacement on its
        port, as a process supervisor would: the agents keep its address and retry
        meanwhile. Then every gateway must come back (:meth:`gateways_back`)."""
        async with self.one_off:
            if not self.ctx.driving:
                return
            index = self.ctx.figures[GATEWAY_KILLS] % len(self.stack.gateways)
            victim, replacement = self.stack.replace_gateway(index)
            self.ctx.figures[GATEWAY_KILLS] += 1
            fault = self.ctx.recovery.fault_ended(
                "gateway SIGKILL", self.ctx.in_flight(), self.stack.gateway_urls
            )
            self.ctx.say(f"SIGKILL {victim.name}; {replacement.name} started on its port")
            await self.gateways_back(fault, f"the SIGKILL of {victim.name}")

    async def gateways_back(self, fault: FaultEnd, after: str) -> None:
        """Wait until every gateway answers ``GET /readyz`` 200 and a real request 2xx
        (times in the recovery table); one that does not within ``HANG_SECONDS``, or
        exits, is a violation naming it."""
        back = await asyncio.gather(
            *(self.gateway_back(fault, index, after) for index in range(len(self.stack.gateways)))
        )
        self.ctx.say(f"after {after}: " + "; ".join(back))

    async def gateway_back(self, fault: FaultEnd, index: int, after: str) -> str:
        """Wait for one gateway's return (see :meth:`gateways_back`); says how it went."""
        gateway, url = self.stack.gateways[index], self.stack.gateway_urls[index]
        named = f"{gateway.name} ({url})"

        async def ready() -> bool:
            if gateway.process.poll() is not None:
                raise ChildProcessError(f"{named} exited with {gateway.process.returncode}")
            try:
                response = await self.ctx.http.get(f"{url}/readyz", timeout=GATEWAY_PROBE_TIMEOUT)
            except httpx.HTTPError:
                return False
            if response.status_code != 200:
                return False
            self.ctx.recovery.gateway_ready(fault, url)
            return True

        async def answered() -> bool:
            if fault.gateways[url].first_2xx is None:
                await self.real_request(url)
            return fault.gateways[url].first_2xx is not None

        for what, read, moment in (
            ("GET /readyz 200", ready, "ready"),
            ("a real request 2xx", answered, "first 2xx"),
        ):
            try:
                await eventually(read, what=f"{named} answers {what} after {after}", interval=0.2)
            except (AssertionError, ChildProcessError) as error:
                self.ctx.violations.append(
                    f"{named} did not come back after {after} (no {what} within "
                    f"{HANG_SECONDS:g} s): {error}"
                )
                return f"{gateway.name} NOT BACK (never {moment})"
        returned = fault.gateways[url]
        assert returned.ready is not None and returned.first_2xx is not None
        return (
            f"{gateway.name} ready after {returned.ready - fault.ended:.1f} s, "
            f"first 2xx after {returned.first_2xx - fault.ended:.1f} s"
        )

    async def real_request(self, url: str) -> None:
        """What an agent does to learn how its task ended: its key and body sent again
        (the gateway reads the key's record in PostgreSQL), for a task that has ended; the
        agents' own answers count as well, so this only matters once they go quiet."""
        record = self.ended_task()
        if record is None:
            return
        try:
            response = await self.ctx.http.post(
                f"{url}/v1/tasks", json=record.body, headers=self.ctx.headers(record.key)
            )
        except httpx.HTTPError:
            return
        if 200 <= response.status_code < 300:
            # A key answered with another task is caught by the checker.
            record.task_ids.add(response.json()["task_id"])
        self.ctx.recovery.gateway_answered(response.status_code, url)

    def ended_task(self) -> TaskRecord | None:
        return next(
            (
                r
                for r in reversed(self.ctx.records)
                if r.tool != OPEN_TASK and r.final_state in ("succeeded", "failed")
            ),
            None,
        )

    async def heal(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.ctx.http.delete(f"{self.stack.far['provider_url']}/_test/faults")
            await self.ctx.http.delete(f"{self.stack.far['smtp_control_url']}/faults")
