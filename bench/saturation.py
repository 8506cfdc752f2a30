"""Throughput at saturation: the highest rate of one-step calls onceflow sustains, and bare
Temporal on the same servers, found by an open loop at a rising rate.

It runs on the processes ``task_overhead`` measures (``bench/_stack.py``: one dev server,
one PostgreSQL, an ``onceflow worker``, an ``onceflow gateway``, the bare worker and the
bare FastAPI endpoint, tracing on into a stand-in collector) and the same two paths
(``bench/_one_step.py``): on the worker path ``TaskClient`` against ``execute_workflow``,
on the gateway path ``POST /v1/tools/issue_coupon/calls`` with a new key against the bare
endpoint. Each path's two arms are measured in the same run, one step each at a rate,
the one that went first going second at the next rate, so drift hits both.

**A step** offers ``R`` calls/s for ``--step-seconds`` (T): its R × T calls are launched
at Poisson arrival times given their count (seeded by R, so both arms get the same
schedule at a rate) whether or not earlier calls have ended, and each call's latency runs
from its scheduled time, so a late launch counts against the arm too. A call ends as
``succeeded``, as an answer that is not a success (an HTTP status such as the gateway's
202 once its bounded wait is over, a task state), as given up after
``GIVE_UP_AFTER_SECONDS``, or as the exception that ended it. Recorded per step: offered
rate, calls launched, achieved rate (calls succeeded by T, over T), calls succeeded by
T + ``--drain-seconds`` (D), p50 and p99 of the succeeded calls, how every call ended,
calls still in flight at T + D, how late the launches were (p99), and the CPU each
process used during T (cores). Before the next step every call has ended and no workflow
of either task queue still runs. A worker-path onceflow step claims its calls'
idempotency records before T, as ``task_overhead`` does.

**The knee** of an arm is the highest offered rate of a step it sustained. A step is
sustained when both hold:

1. at least ``COMPLETED_SHARE`` (95 %) of the calls launched succeeded by T + D: the arm
   kept up with the offered rate, less a short drain;
2. its p99 is at most ``P99_GROWTH`` (5×) the arm's p99 in its first step, at the lowest
   rate, or at most D where that is more: no queue built up inside the step that the
   drain would still absorb. A p99 within D is never held against a step: rule 1 already
   grants the step's last calls that long.

An arm is offered no higher rate once two steps in a row failed; the rate rises by
``--step`` until both arms stopped or ``--max-rate`` is passed. An arm that never failed
has a knee of at least ``--max-rate`` (``limited_by_max_rate``). The result per path: both
knees and the ratio onceflow / bare.

Every process, both servers and this load generator share the machine's cores: the
knees say what one host of this kind sustains with everything on it, and the CPU per
step says which process ran out first. After the run: every onceflow task that
succeeded issued exactly one coupon, and no idempotency record is left ``processing``.

Usage: ``.venv/bin/python -m bench.saturation [--paths gateway,worker] [--start-rate 10]
[--step 10] [--step-seconds 20] [--max-rate 200] [--drain-seconds 2]``; writes
``bench/results/saturation.json`` and ``saturation.png``.
"""

import argparse
import asyncio
import json
import os
import random
import tempfile
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from temporalio.client import Client

from bench._one_step import (
    GatewayPath,
    Operation,
    UnexpectedAnswer,
    WorkerPath,
    coupons_and_records,
    one_step_paths,
)
from bench._report import RESULTS, pyplot, run_info
from bench._stack import OneStepStack, one_step_stack
from bench.open_task_calls import CpuMeter
from onceflow.task_api._listing import state_filter
from onceflow.workflows.task_models import TaskState

COMPLETED_SHARE = 0.95
"""Share of a step's calls that must succeed by the end of its drain."""
P99_GROWTH = 5.0
"""How far a step's p99 may grow over the arm's p99 in its first step (or up to the
drain, where that is more)."""
FAILS_TO_STOP = 2
"""Failed steps in a row after which an arm is offered no higher rate."""
GIVE_UP_AFTER_SECONDS = 30.0
"""How long the load generator waits for one call before counting it as given up."""
QUIET_TIMEOUT_SECONDS = 120.0
"""How long the run waits for the workflows of a step to end before the next step."""
WARM_UP_SECONDS = 3.0
SUCCEEDED = "succeeded"
RESULTS_FILE = RESULTS / "saturation.json"
PLOT_FILE = RESULTS / "saturation.png"


@dataclass
class Step:
    """One arm's step at one offered rate; times in seconds from the step's start."""

    arm: str
    offered_per_s: float
    seconds: float
    drain_seconds: float
    launched: int
    achieved_per_s: float
    """Calls succeeded by the end of the step's ``seconds``, per second of it."""
    succeeded_by_drain: int
    p50_ms: float | None
    p99_ms: float | None
    outcomes: dict[str, int]
    """How every launched call ended, once all had."""
    in_flight_at_drain: int
    launch_lag_p99_ms: float
    cpu_cores: dict[str, float]
    load_average_1m: float
    failed_because: str | None = None

    @property
    def completed_share(self) -> float:
        return self.succeeded_by_drain / self.launched if self.launched else 1.0

    @property
    def sustained(self) -> bool:
        return self.failed_because is None

    def as_json(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "completed_share": self.completed_share,
            "not_succeeded": sum(n for name, n in self.outcomes.items() if name != SUCCEEDED),
            "cpu_cores_total": sum(self.cpu_cores.values()),
            "sustained": self.sustained,
        }


@dataclass
class ArmProgress:
    """One arm of a path as the rate rises: its steps, and whether it is still offered more."""

    label: str
    """``bare`` or ``onceflow``."""
    operation: Operation
    steps: list[Step] = field(default_factory=list)
    failures_in_row: int = 0

    @property
    def running(self) -> bool:
        return self.failures_in_row < FAILS_TO_STOP

    @property
    def knee(self) -> float | None:
        return max((step.offered_per_s for step in self.steps if step.sustained), default=None)

    def judge(self, step: Step) -> None:
        """Mark ``step`` sustained or not (the module's rule) and count failures in a row."""
        reference = self.steps[0].p99_ms if self.steps else step.p99_ms
        reasons = []
        if step.completed_share < COMPLETED_SHARE:
            reasons.append(f"{step.completed_share:.0%} succeeded by the drain's end")
        if step.p99_ms is not None and reference is not None:
            limit = max(P99_GROWTH * reference, step.drain_seconds * 1000)
            if step.p99_ms > limit:
                reasons.append(f"p99 {step.p99_ms / reference:.1f}x the first step's")
        step.failed_because = "; ".join(reasons) or None
        self.failures_in_row = 0 if step.sustained else self.failures_in_row + 1
        self.steps.append(step)


# ── one step ────────────────────────────────────────────────────────────────────────


def _arrivals(rate: float, seconds: float) -> list[float]:
    """``rate × seconds`` launch times in ``[0, seconds)``, uniform and independent: a
    Poisson process given its count, so every step offers exactly its rate, in bursts
    and lulls; the same for every arm at ``rate``."""
    draw = random.Random(round(rate * 1000))
    return sorted(draw.uniform(0, seconds) for _ in range(round(rate * seconds)))


def _outcome_of(error: Exception) -> str:
    if isinstance(error, UnexpectedAnswer):
        return error.status
    if isinstance(error, TimeoutError):
        return f"given up after {GIVE_UP_AFTER_SECONDS:g} s"
    return type(error).__name__


def _percentile_ms(latencies: list[float], fraction: float) -> float | None:
    if not latencies:
        return None
    ordered = sorted(latencies)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)] * 1000


async def open_loop_step(
    label: str, operation: Operation, rate: float, seconds: float, drain: float, meter: CpuMeter
) -> Step:
    """Launch ``operation`` at ``rate`` for ``seconds`` on a schedule, never waiting for
    earlier calls; return once every call has ended."""
    due_times = _arrivals(rate, seconds)
    items = (
        await operation.prepare(len(due_times)) if operation.prepare else [None] * len(due_times)
    )
    loop = asyncio.get_running_loop()
    ended: list[tuple[float, float, str]] = []
    """(end, latency from the scheduled launch, outcome) of each call, as they end."""
    lags: list[float] = []

    async def call(item: Any, due: float) -> None:
        try:
            await asyncio.wait_for(operation.run(item), GIVE_UP_AFTER_SECONDS)
            outcome = SUCCEEDED
        except Exception as error:  # every way a call can end is a figure of the step
            outcome = _outcome_of(error)
        end = loop.time() - began
        ended.append((end, end - due, outcome))

    cpu_before = meter.read()
    began = loop.time()
    calls = []
    for due, item in zip(due_times, items, strict=True):
        pause = began + due - loop.time()
        if pause > 0:
            await asyncio.sleep(pause)
        lags.append(loop.time() - began - due)
        calls.append(asyncio.create_task(call(item, due)))
    await asyncio.sleep(max(began + seconds - loop.time(), 0.0))
    cpu = {name: (used - cpu_before[name]) / seconds for name, used in meter.read().items()}
    await asyncio.sleep(max(began + seconds + drain - loop.time(), 0.0))
    in_flight = sum(not task.done() for task in calls)
    await asyncio.gather(*calls)
    succeeded = [(end, latency) for end, latency, outcome in ended if outcome == SUCCEEDED]
    latencies = [latency for _, latency in succeeded]
    return Step(
        arm=label,
        offered_per_s=rate,
        seconds=seconds,
        drain_seconds=drain,
        launched=len(due_times),
        achieved_per_s=sum(end <= seconds for end, _ in succeeded) / seconds,
        succeeded_by_drain=sum(end <= seconds + drain for end, _ in succeeded),
        p50_ms=_percentile_ms(latencies, 0.50),
        p99_ms=_percentile_ms(latencies, 0.99),
        outcomes=dict(Counter(outcome for _, _, outcome in ended)),
        in_flight_at_drain=in_flight,
        launch_lag_p99_ms=_percentile_ms(lags, 0.99) or 0.0,
        cpu_cores=cpu,
        load_average_1m=round(os.getloadavg()[0], 2),
    )


async def _running_workflows(client: Client, queues: Sequence[str]) -> int:
    listed = ", ".join(f"'{queue}'" for queue in queues)
    query = f"TaskQueue IN ({listed}) AND ExecutionStatus = 'Running'"
    return (await client.count_workflows(query)).count


async def wait_until_quiet(client: Client, queues: Sequence[str]) -> int:
    """Wait until no workflow of ``queues`` runs (a call given up on leaves its workflow
    running), at most ``QUIET_TIMEOUT_SECONDS``; the number still running then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_TIMEOUT_SECONDS
    while (running := await _running_workflows(client, queues)) and loop.time() < deadline:
        await asyncio.sleep(0.5)
    return running


# ── the rising rate ─────────────────────────────────────────────────────────────────


@dataclass
class Rates:
    """The rates offered (calls/s) and each step's launch and drain time (s)."""

    start: float
    step: float
    maximum: float
    seconds: float
    drain: float


async def saturate(
    path: WorkerPath | GatewayPath, stack: OneStepStack, rates: Rates
) -> list[ArmProgress]:
    """Both arms of ``path`` at rising rates, alternating, until both stopped."""
    arms = [
        ArmProgress("bare", path.baseline),
        ArmProgress("onceflow", path.candidate),
    ]
    queues = (stack.queue, stack.bare_queue)
    for arm in arms:  # warm-up: imports, connections, caches; not recorded
        await open_loop_step(
            arm.label, arm.operation, rates.start, WARM_UP_SECONDS, rates.drain, stack.meter
        )
        await wait_until_quiet(stack.temporal.client, queues)
    rate, number = rates.start, 0
    while rate <= rates.maximum + 1e-9 and any(arm.running for arm in arms):
        order = arms if number % 2 == 0 else arms[::-1]
        for arm in (arm for arm in order if arm.running):
            step = await open_loop_step(
                arm.label, arm.operation, rate, rates.seconds, rates.drain, stack.meter
            )
            left_running = await wait_until_quiet(stack.temporal.client, queues)
            arm.judge(step)
            _print_step(step, left_running)
        rate, number = rate + rates.step, number + 1
    return arms


def _print_step(step: Step, left_running: int) -> None:
    p50 = f"{step.p50_ms:.0f}" if step.p50_ms is not None else "-"
    p99 = f"{step.p99_ms:.0f}" if step.p99_ms is not None else "-"
    others = {name: n for name, n in step.outcomes.items() if name != SUCCEEDED}
    print(
        f"    {step.arm:<8} {step.offered_per_s:6.1f}/s offered: launched {step.launched:5d}, "
        f"achieved {step.achieved_per_s:6.1f}/s, {step.completed_share:4.0%} by drain, "
        f"p50 {p50} ms, p99 {p99} ms, in flight {step.in_flight_at_drain}, "
        f"not succeeded {others or 0}, cores {sum(step.cpu_cores.values()):.2f}, "
        f"launch lag p99 {step.launch_lag_p99_ms:.0f} ms"
        + (f", {left_running} workflows still running" if left_running else "")
        + (" — sustained" if step.sustained else f" — FAILED: {step.failed_because}"),
        flush=True,
    )


def _path_result(path: WorkerPath | GatewayPath, arms: list[ArmProgress]) -> dict[str, Any]:
    bare, onceflow = arms
    knees = {arm.label: arm.knee for arm in arms}
    return {
        "arms": {"bare": path.baseline.arm.name, "onceflow": path.candidate.arm.name},
        "knee_per_s": knees,
        "knee_limited_by_max_rate": {arm.label: arm.running for arm in arms},
        "ratio": (
            onceflow.knee / bare.knee
            if onceflow.knee is not None and bare.knee is not None
            else None
        ),
        "first_step_p99_ms": {arm.label: arm.steps[0].p99_ms for arm in arms if arm.steps},
        "steps": [
            step.as_json()
            for step in sorted(
                (step for arm in arms for step in arm.steps),
                key=lambda step: (step.offered_per_s, step.arm),
            )
        ],
    }


# ── the business outcome ────────────────────────────────────────────────────────────


async def business_outcome(stack: OneStepStack) -> dict[str, Any]:
    """After every step: each onceflow task that succeeded issued exactly one coupon (no
    task left a second one, none that failed left any), and every idempotency record
    ended."""
    client = stack.temporal.client
    query = f"TaskQueue = '{stack.queue}' AND ExecutionStatus = 'Completed'"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_TIMEOUT_SECONDS
    while True:  # outcomes are written, and visibility catches up, a little after the end
        coupons, states = coupons_and_records(stack.database_url)
        tasks = (await client.count_workflows(query)).count
        succeeded = (
            await client.count_workflows(f"{query} AND {state_filter(TaskState.SUCCEEDED)}")
        ).count
        settled = states.get("processing", 0) == 0 and coupons == succeeded
        if settled or loop.time() > deadline:
            break
        await asyncio.sleep(1.0)
    outcome = {
        "onceflow tasks completed (incl. warm-up)": tasks,
        "of which succeeded": succeeded,
        "coupons issued": coupons,
        "idempotency records by state": states,
    }
    print(f"  outcome: {outcome}", flush=True)
    assert coupons == succeeded, outcome
    assert states.get("processing", 0) == 0, outcome
    return outcome


# ── the run ─────────────────────────────────────────────────────────────────────────


async def main(wanted: Sequence[str], rates: Rates) -> None:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as directory:
        async with AsyncExitStack() as stack:
            servers = await stack.enter_async_context(
                one_step_stack(Path(directory), gateway="gateway" in wanted)
            )
            # Open loop: as many connections as calls in flight, none waits for a slot.
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            http = await stack.enter_async_context(
                httpx.AsyncClient(timeout=GIVE_UP_AFTER_SECONDS + 5, limits=limits)
            )
            paths = one_step_paths(servers, wanted, http)
            for name in wanted:
                print(f"  {name} path", flush=True)
                arms = await saturate(paths[name], servers, rates)
                results[name] = _path_result(paths[name], arms)
                knees = results[name]["knee_per_s"]
                print(f"  {name} path knees: {knees}; ratio {results[name]['ratio']}", flush=True)
            outcome = await business_outcome(servers)
    _save(results, outcome, wanted, rates)


def _save(
    paths: dict[str, Any], outcome: dict[str, Any], wanted: Sequence[str], rates: Rates
) -> None:
    document = {
        "title": "throughput at saturation",
        "run": run_info(
            n_per_arm=f"rate × {rates.seconds:g} s a step",
            concurrency="open loop (calls in flight: whatever the rate makes them)",
            rounds="one step per arm at each rate, the arms alternating",
            arguments={"paths": ",".join(wanted), **asdict(rates)},
        ),
        "knee_rule": {
            "completed_share": COMPLETED_SHARE,
            "drain_seconds": rates.drain,
            "p99_growth_over_first_step": P99_GROWTH,
            "p99_always_allowed_seconds": rates.drain,
            "failed_steps_in_row_to_stop": FAILS_TO_STOP,
            "give_up_after_seconds": GIVE_UP_AFTER_SECONDS,
        },
        "paths": paths,
        "outcome": outcome,
    }
    RESULTS.mkdir(exist_ok=True)
    RESULTS_FILE.write_text(json.dumps(document, indent=2) + "\n")
    _plot(paths, rates)
    print(f"  wrote {RESULTS_FILE} and {PLOT_FILE}")


def _plot(paths: dict[str, Any], rates: Rates) -> None:
    """Achieved vs offered rate, one panel a path: both arms, their knees, and the line
    where achieved equals offered."""
    plt = pyplot()
    if plt is None:
        return

    figure, axes = plt.subplots(1, len(paths), figsize=(6 * len(paths), 4), squeeze=False)
    for axis, (name, result) in zip(axes[0], paths.items(), strict=True):
        top = max(step["offered_per_s"] for step in result["steps"])
        axis.plot([0, top], [0, top], color="grey", linestyle=":", label="achieved = offered")
        for label, color in (("bare", "tab:blue"), ("onceflow", "tab:orange")):
            steps = [step for step in result["steps"] if step["arm"] == label]
            axis.plot(
                [step["offered_per_s"] for step in steps],
                [step["achieved_per_s"] for step in steps],
                marker="o",
                color=color,
                label=f"{label}: {result['arms'][label]}",
            )
            failed = [step for step in steps if not step["sustained"]]
            axis.scatter(
                [step["offered_per_s"] for step in failed],
                [step["achieved_per_s"] for step in failed],
                s=120,
                facecolors="none",
                edgecolors="red",
            )
            knee = result["knee_per_s"][label]
            if knee is not None:
                axis.axvline(knee, color=color, linestyle="--", alpha=0.6)
        axis.set_title(f"{name} path (knee ratio {_ratio_text(result['ratio'])})")
        axis.set_xlabel("offered (calls/s)")
        axis.set_ylabel(f"achieved (calls/s succeeded within the {rates.seconds:g} s step)")
        axis.legend(fontsize=7, loc="upper left")
    figure.suptitle("open loop at a rising rate; red rings: steps not sustained", fontsize=9)
    figure.tight_layout()
    figure.savefig(PLOT_FILE, dpi=110)
    plt.close(figure)


def _ratio_text(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "n/a"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="gateway,worker", help="gateway, worker or both")
    parser.add_argument("--start-rate", type=float, default=10.0, help="calls/s of the first step")
    parser.add_argument("--step", type=float, default=10.0, help="calls/s added each step")
    parser.add_argument("--step-seconds", type=float, default=20.0, help="launch time per step")
    parser.add_argument("--max-rate", type=float, default=200.0, help="highest rate offered")
    parser.add_argument(
        "--drain-seconds", type=float, default=2.0, help="after a step, for its calls to end"
    )
    parsed = parser.parse_args()
    asyncio.run(
        main(
            parsed.paths.split(","),
            Rates(
                parsed.start_rate,
                parsed.step,
                parsed.max_rate,
                parsed.step_seconds,
                parsed.drain_seconds,
            ),
        )
    )
