"""The chaos run (``tests/chaos/harness``) at CI size: real gateways, workers, relays, Temporal,
PostgreSQL and far sides, broken on purpose while tasks of every tool, and open tasks
whose agents send calls one by one, run through them.

The run checks its history against the far sides' own records (provider ledger and
request log, SMTP sink, deployment target, business rows); this test asserts it found no
violation and no stuck task, and that every kind of fault was really injected: among
them a worker SIGSTOPped for longer than the provider keeps payment keys (6 s in the
run), gateways SIGKILLed and replaced, and PostgreSQL held down 30 s under load; after
each of the last two, every gateway came back ready and answering (a gateway that does
not is a violation naming it).
"""

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.chaos.harness.config import (
    OPEN_TASK_TOOLS,
    POSTGRES_OUTAGE_SECONDS,
    TOOLS,
    ChaosConfig,
)
from tests.chaos.harness.faults import GATEWAY_KILLS
from tests.chaos.harness.records import ChaosReport
from tests.chaos.harness.run import run_chaos

CI_SIZE = ChaosConfig(
    tasks=160,
    concurrency=24,
    kill_every_tasks=12,
    fault_every_tasks=2,
    pg_kill_every_tasks=16,
    gateway_kill_every_tasks=30,
    open_task_share=0.1,
    settle_seconds=240.0,
    time_limit=660.0,
)
"""Sized for a 2-core CI machine: three to four minutes here beside the other tests, a
worker paused past the key window, Temporal restarted once, PostgreSQL held down 30 s
once (the run's one long outage), a worker killed each time another 12 tasks have ended
(each kill waiting for a ready worker), a gateway each time another 30 (two to four, in
turn), and 16 open tasks (about 80 calls). Every fault is paced by the tasks that
end, so a machine half as fast meets the same faults per task; the settle time and the
time limit are safety nets (the run goes on as soon as its tasks have ended), several
times what a slow machine needs, and the limit reports where the run stood. The large
run (BENCHMARKS.md) is where kills come by the hundred."""


KEPT = Path(tempfile.gettempdir()) / "onceflow-chaos-runs"
"""Where a failed run's process logs and Temporal database are kept: the test session
deletes its own temporary folder when it ends."""


@pytest.mark.timeout(720)
async def test_no_task_has_two_effects_or_gets_stuck_under_chaos(tmp_path: Path) -> None:
    try:
        report = await run_chaos(CI_SIZE, scratch=tmp_path, say=print)
        print(report.table())
        check(report)
    except BaseException:
        kept = KEPT / time.strftime("%Y%m%dT%H%M%S")
        shutil.copytree(tmp_path, kept, ignore=shutil.ignore_patterns("pg", ".s.PGSQL*"))
        print(f"the failed run's logs and Temporal database are kept in {kept}")
        raise


def check(report: ChaosReport) -> None:
    assert report.violations == []
    assert report.stuck == []
    figures = report.figures
    assert figures["acknowledged"] == CI_SIZE.tasks
    assert figures["task workflows in Temporal"] == CI_SIZE.tasks
    # ... and every one of them replayed as it ran (a divergence is a violation above).
    assert figures["task histories replayed from their first event"] >= CI_SIZE.tasks
    # One kill per 12 tasks ended while agents still submitted (about 136 of 160).
    assert figures["workers SIGKILLed (each replaced)"] >= 5
    assert figures["Temporal dev server restarts"] == 1
    assert figures["workers SIGSTOPped past a key window"] >= 1
    assert figures["PostgreSQL restarts"] == 1
    assert figures["PostgreSQL downtime (s)"] >= POSTGRES_OUTAGE_SECONDS
    # One gateway kill per 30 tasks ended while agents still submitted.
    assert figures[GATEWAY_KILLS] >= 2
    # Every gateway came back after each (one that did not is a violation, above).
    for fault in ("PostgreSQL restart", "gateway SIGKILL"):
        for row in ("every gateway ready", "first 2xx on each gateway"):
            assert f"recovery: {fault}: {row}, worst (s)" in figures, (fault, row)
    assert figures["provider faults injected"] > 0
    assert figures["SMTP faults injected"] > 0
    assert figures["pg_terminate_backend rounds"] > 0
    for tool in TOOLS:
        assert report.per_tool[tool]["succeeded"] > 0, tool
    # Open tasks: every one ended closed (or parked on a parked call: not stuck, above),
    # each of their tools had calls succeed, and the agents' resends and the model's
    # repeats really happened (the run found each answered without a second effect).
    assert figures["open tasks"] == round(CI_SIZE.tasks * CI_SIZE.open_task_share)
    assert figures["open tasks closed"] > 0
    for tool in OPEN_TASK_TOOLS:
        assert report.per_tool[f"open/{tool}"]["succeeded"] > 0, tool
    assert figures["open-task repeats answered by the repeat guard"] > 0
    assert figures["open-task calls repeated while the first one waited"] > 0
    assert figures["open-task call answers lost (resent with the same key)"] > 0
    assert figures["open-task final answers asked again: the same answer"] > 0
