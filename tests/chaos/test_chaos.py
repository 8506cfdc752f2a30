"""The chaos run (``bench/chaos.py``) at CI size: real gateways, workers, relays, Temporal,
PostgreSQL and far sides, broken on purpose while tasks of every tool run through them.

The run checks its history against the far sides' own records (provider ledger and
request log, SMTP sink, deployment target, business rows); this test asserts it found no
violation and no stuck task, and that every kind of fault was really injected: among
them a worker SIGSTOPped for longer than the provider keeps payment keys (6 s in the
run) and PostgreSQL stopped and started again.
"""

from pathlib import Path

import pytest

from bench.chaos import TOOLS, ChaosConfig, run_chaos

CI_SIZE = ChaosConfig(tasks=180, concurrency=24, kill_every=2.0, settle_seconds=45.0)
"""Sized for a 2-core CI machine: about a minute of driving, five to fifteen worker kills, a worker
paused past the key window, Temporal and PostgreSQL each restarted once."""


@pytest.mark.timeout(300)
async def test_no_task_has_two_effects_or_gets_stuck_under_chaos(tmp_path: Path) -> None:
    report = await run_chaos(CI_SIZE, scratch=tmp_path, say=print)

    print(report.table())
    assert report.violations == []
    assert report.stuck == []
    figures = report.figures
    assert figures["acknowledged"] == CI_SIZE.tasks
    assert figures["task workflows in Temporal"] == CI_SIZE.tasks
    assert figures["workers SIGKILLed (each replaced)"] >= 5
    assert figures["Temporal dev server restarts"] == 1
    assert figures["workers SIGSTOPped past a key window"] >= 1
    assert figures["PostgreSQL restarts"] == 1
    assert figures["provider faults injected"] > 0
    assert figures["SMTP faults injected"] > 0
    assert figures["pg_terminate_backend rounds"] > 0
    for tool in TOOLS:
        assert report.per_tool[tool]["succeeded"] > 0, tool
