"""Provider brownout: what a fleet of charge tasks sends a provider that fails for a while,
and what becomes of the tasks once it answers again, with the fleet-wide per-provider retry
budget on and off (issue #41).

Each phase (one fault kind, one budget mode) runs on servers of its own: a fresh embedded
PostgreSQL, a fresh Temporal dev server and a fresh local Stripe-compatible provider (in
this process), so no budget, key or task carries over from another phase. Two ``onceflow
worker`` and two ``onceflow gateway`` processes serve ``charge_payment`` with
``ONCEFLOW_PROVIDER_BUDGETS`` set to the mode. The provider then fails every ``POST
/v1/payment_intents`` (``times=None``) for the brownout, and ``--tasks`` charge tasks, each
a distinct order under the default retry budget, are started at its start over HTTP,
round-robin over the two gateways. When the brownout ends the fault is cleared and the
tasks are watched, through the gateways' ``GET /v1/tasks/{id}``, for up to 60 s or until
every one has succeeded, failed or parked.

Measured per phase: the provider's own request log (POSTs to ``/v1/payment_intents`` that
arrived during the brownout, and their ratio to the tasks; the target with the budget on is
at most 1.2 per task), the tasks' states when the provider answers again, 3 s later and at
the end (succeeded within the 60 s and when the last of them did, parked, failed), and
safety from the provider's ledger: at most one PaymentIntent per order, and no POST under a
key other than its task's derived key.

The 500 fault is ``error_500_before_executing``: a 500 before the endpoint began, nothing
charged and nothing stored under the key, as in the issue's table, so a same-key retry
after the brownout can succeed. ``500-stored`` (``error_500_before_commit``: the 500 is
stored under the key and replayed to every repeat) is available, not run by default.

Usage: ``.venv/bin/python -m bench.provider_brownout [--tasks 40] [--brownout-seconds 30]
[--modes on off] [--faults 500 429]``
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from onceflow_devstack.stripe_provider import (
    Fault,
    LedgerEntry,
    ProviderConfig,
    ProviderControl,
    RequestRecord,
    running_provider,
)

from bench._report import RESULTS, machine, run_info
from bench._servers import running_servers
from bench._stack import Process, start_process, stop_process
from onceflow.gateway import PrincipalStore
from onceflow.payments import CHARGE_CHILD_OP
from onceflow.storage import build_pool
from onceflow.tools.worker import derive_child_key

RESULTS_FILE = RESULTS / "provider_brownout.json"
FAULTS = {
    "500": Fault.ERROR_500_BEFORE_EXECUTING,
    "429": Fault.RATE_LIMIT_429,
    "500-stored": Fault.ERROR_500_BEFORE_COMMIT,
}
"""``--faults`` names and the provider fault each holds for the brownout."""
MODES = {"on": True, "off": False}
"""``--modes`` names and the ``ONCEFLOW_PROVIDER_BUDGETS`` each sets."""
CHARGES = "/v1/payment_intents"
TOOL = "charge_payment"
TENANT = "bench"
STRIPE_KEY = "sk_test_onceflow_brownout"
ACCOUNT = "acct_onceflow_brownout"
COPIES = 2
"""Workers and gateways each phase runs: the issue's brownout went through two gateways."""
OBSERVE_SECONDS = 60.0
"""How long the tasks are watched once the provider answers again."""
SNAPSHOT_AFTER = 3.0
"""The issue's table reads the tasks this long after the provider answers again."""
POLL_SECONDS = 1.0
"""How often every task's status is read: the resolution of the success times."""
TARGET_POSTS_PER_TASK = 1.2
SETTLED = {"succeeded", "failed", "parked"}
"""States that no longer change without a person: a task in one is not waited for."""


@dataclass
class Fleet:
    """The tasks of one phase, as the gateways report them."""

    gateways: list[str]
    headers: dict[str, str]
    gateway_of: dict[str, str] = field(default_factory=dict)
    """Task id → the gateway that started it (and is asked for its status)."""
    views: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Task id → its latest status body."""
    succeeded_at: dict[str, float] = field(default_factory=dict)
    """Task id → Unix time of the first read that saw it succeeded."""
    unanswered_reads: Counter[str] = field(default_factory=Counter)
    """Status reads that got no view, by what came instead."""

    def states(self) -> Counter[str]:
        return Counter(str(view.get("state")) for view in self.views.values())

    def settled(self) -> bool:
        return all(view.get("state") in SETTLED for view in self.views.values())


async def start_tasks(http: httpx.AsyncClient, fleet: Fleet, phase: str, tasks: int) -> None:
    """``tasks`` charges, each a distinct order under its own key, all at once, round-robin
    over the gateways; answered at once (the gateways wait 0 s for a result)."""

    async def start(number: int) -> None:
        gateway = fleet.gateways[number % len(fleet.gateways)]
        answer = await http.post(
            f"{gateway}/v1/tools/{TOOL}/calls",
            json={
                "amount": 4200,
                "currency": "eur",
                "customer": "cus_brownout",
                "payment_method": "pm_card_visa",
                "order_id": f"ord-{phase}-{number}",
            },
            headers={**fleet.headers, "Idempotency-Key": f"brownout-{phase}-{number}"},
        )
        if answer.status_code not in (200, 202):
            raise RuntimeError(f"task {number}: {answer.status_code} {answer.text[:300]}")
        view = answer.json()
        fleet.gateway_of[view["task_id"]] = gateway
        fleet.views[view["task_id"]] = view

    await asyncio.gather(*(start(number) for number in range(tasks)))


async def read_statuses(http: httpx.AsyncClient, fleet: Fleet) -> None:
    """Every unfinished task's status; a read that fails keeps the last one seen."""

    async def read(task_id: str) -> None:
        try:
            answer = await http.get(
                f"{fleet.gateway_of[task_id]}/v1/tasks/{task_id}", headers=fleet.headers
            )
        except httpx.HTTPError as error:
            fleet.unanswered_reads[type(error).__name__] += 1
            return
        if answer.status_code != 200:
            # 503 task-unanswered: a busy worker; the next round asks again.
            fleet.unanswered_reads[f"{answer.status_code} {answer.text[:200]}"] += 1
            return
        view = answer.json()
        fleet.views[task_id] = view
        if view.get("state") == "succeeded":
            fleet.succeeded_at.setdefault(task_id, time.time())

    unfinished = [
        task_id
        for task_id, view in fleet.views.items()
        if view.get("state") not in ("succeeded", "failed")
    ]
    await asyncio.gather(*(read(task_id) for task_id in unfinished))


async def watch_until(http: httpx.AsyncClient, fleet: Fleet, deadline: float) -> None:
    """Read the statuses every ``POLL_SECONDS`` until ``deadline`` (Unix time)."""
    while time.time() < deadline:
        began = time.time()
        await read_statuses(http, fleet)
        # The sampling cadence of the measurement, not a wait for something to happen.
        pause = min(began + POLL_SECONDS, deadline) - time.time()
        await asyncio.sleep(max(0.0, pause))


@asynccontextmanager
async def onceflow_processes(scratch: Path, env: dict[str, str]) -> AsyncIterator[list[str]]:
    """``COPIES`` workers and gateways, started at once; yields the gateways' URLs. All are
    stopped together at the end."""
    started: list[Process] = []

    async def one(arguments: list[str], log_name: str, ready: str) -> str:
        process, rest = await start_process(arguments, env, scratch / log_name, ready)
        started.append(process)
        return rest

    try:
        async with asyncio.TaskGroup() as group:
            for number in range(COPIES):
                group.create_task(
                    one(
                        ["-m", "onceflow.cli.main", "worker"],
                        f"worker-{number}.log",
                        "onceflow worker ready",
                    )
                )
            gateways = [
                group.create_task(
                    one(
                        ["-m", "onceflow.cli.main", "gateway", "--port", "0"],
                        f"gateway-{number}.log",
                        "onceflow gateway ready on ",
                    )
                )
                for number in range(COPIES)
            ]
        yield [gateway.result().split()[0] for gateway in gateways]
    finally:
        await asyncio.gather(*(asyncio.to_thread(stop_process, p) for p in started))


async def run_phase(
    scratch: Path, fault_name: str, mode: str, tasks: int, brownout_seconds: float
) -> dict[str, Any]:
    """One brownout on servers of its own; its figures."""
    phase = f"{fault_name}-{mode}-{uuid.uuid4().hex[:6]}"
    async with AsyncExitStack() as stack:
        servers = await stack.enter_async_context(running_servers(scratch))
        provider = await stack.enter_async_context(running_provider(ProviderConfig()))
        control = await stack.enter_async_context(ProviderControl(provider.base_url))
        pool = await stack.enter_async_context(build_pool(servers.postgres.url, max_size=2))
        _, api_key = await PrincipalStore(pool).create(
            tenant=TENANT, name=f"agent-{phase}", tools=[TOOL], key_quota=1_000_000
        )
        env = {
            "DATABASE_URL": servers.postgres.url,
            "TEMPORAL_ADDRESS": servers.temporal.client.service_client.config.target_host,
            "ONCEFLOW_TASK_QUEUE": f"brownout-{phase}",
            "ONCEFLOW_STATE_DIR": str(scratch / "state"),
            "ONCEFLOW_BUILTIN_TOOLS": TOOL,
            "ONCEFLOW_PROVIDER_BUDGETS": str(MODES[mode]).lower(),
            "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "1",
            "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "0",
            "STRIPE_API_BASE": provider.base_url,
            "STRIPE_API_KEY": STRIPE_KEY,
            "ONCEFLOW_STRIPE_ACCOUNT": ACCOUNT,
        }
        gateways = await stack.enter_async_context(onceflow_processes(scratch, env))
        http = await stack.enter_async_context(
            httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=2 * tasks))
        )
        fleet = Fleet(gateways, {"Authorization": f"Bearer {api_key}"})

        await control.add_fault(FAULTS[fault_name], path_prefix=CHARGES, times=None)
        brownout_began = time.time()
        await start_tasks(http, fleet, phase, tasks)
        started_in = time.time() - brownout_began
        await watch_until(http, fleet, brownout_began + brownout_seconds)
        await control.clear_faults()
        answering = time.time()
        at_recovery = fleet.states()
        await watch_until(http, fleet, answering + SNAPSHOT_AFTER)
        three_after = fleet.states()
        while not fleet.settled() and time.time() - answering < OBSERVE_SECONDS:
            await watch_until(
                http, fleet, min(time.time() + POLL_SECONDS, answering + OBSERVE_SECONDS)
            )
        watched = time.time() - answering
        measured = figures(
            fleet,
            await control.requests(),
            await control.ledger(),
            fault_name=fault_name,
            mode=mode,
            brownout=(brownout_began, answering),
            started_in=started_in,
            watched=watched,
            states={"at_recovery": at_recovery, "3s_after": three_after},
        )
    return measured


def figures(
    fleet: Fleet,
    requests: list[RequestRecord],
    ledger: list[LedgerEntry],
    *,
    fault_name: str,
    mode: str,
    brownout: tuple[float, float],
    started_in: float,
    watched: float,
    states: dict[str, Counter[str]],
) -> dict[str, Any]:
    """One phase's figures from the tasks' statuses and the provider's own records."""
    began, answering = brownout
    tasks = len(fleet.views)
    posts = [r for r in requests if r.method == "POST" and r.path == CHARGES]
    during = [r for r in posts if began <= r.received_at < answering]
    final = fleet.states()
    successes = sorted(
        at - answering for at in fleet.succeeded_at.values() if at - answering <= OBSERVE_SECONDS
    )
    derived = {
        derive_child_key(
            tenant=TENANT,
            workflow_id=task_id,
            step_id=step["step_id"],
            child_op=CHARGE_CHILD_OP,
            provider_account=ACCOUNT,
        ): task_id
        for task_id, view in fleet.views.items()
        for step in view.get("steps", [])
    }
    keys_by_task: dict[str, set[str]] = {}
    for record in posts:
        owner = derived.get(record.idempotency_key or "", "(a key derived for no task)")
        keys_by_task.setdefault(owner, set()).add(record.idempotency_key or "")
    charges = Counter(entry.metadata.get("order_id") for entry in ledger if entry.kind == "charge")
    reasons = Counter(
        (view.get("failure_reason") or _park_reason(view) or "")[:120]
        for view in fleet.views.values()
        if view.get("state") in ("failed", "parked")
    )
    most_charges = max(charges.values(), default=0)
    most_keys = max(
        (len(keys) for owner, keys in keys_by_task.items() if owner in fleet.views), default=0
    )
    foreign = sum(1 for r in posts if (r.idempotency_key or "") not in derived)
    safety = {
        "charges": sum(charges.values()),
        "most_charges_for_one_order": most_charges,
        "distinct_keys_posted": len({r.idempotency_key for r in posts}),
        "most_keys_for_one_task": most_keys,
        "posts_under_a_key_derived_for_no_task": foreign,
        "held": most_charges <= 1 and most_keys <= 1 and foreign == 0,
    }
    return {
        "fault": fault_name,
        "provider_fault": FAULTS[fault_name].value,
        "mode": mode,
        "provider_budgets": MODES[mode],
        "tasks": tasks,
        "brownout_s": round(answering - began, 2),
        "tasks_started_in_s": round(started_in, 2),
        "posts_during_brownout": len(during),
        "posts_per_task": len(during) / tasks,
        "meets_post_target": len(during) <= TARGET_POSTS_PER_TASK * tasks,
        "posts_after_recovery": sum(1 for r in posts if r.received_at >= answering),
        "posts_total": len(posts),
        "post_outcomes_during_brownout": dict(Counter(r.outcome for r in during)),
        "states_at_recovery": dict(states["at_recovery"]),
        "states_3s_after_recovery": dict(states["3s_after"]),
        "states_at_end": dict(final),
        "succeeded_within_60s": len(successes),
        "last_success_after_recovery_s": round(successes[-1], 1) if successes else None,
        "parked": final["parked"],
        "failed": final["failed"],
        "still_running": tasks - final["succeeded"] - final["parked"] - final["failed"],
        "watched_after_recovery_s": round(watched, 1),
        "reasons": dict(reasons.most_common(3)),
        "unanswered_status_reads": dict(fleet.unanswered_reads.most_common(3)),
        "safety": safety,
    }


def _park_reason(view: dict[str, Any]) -> str | None:
    return next(
        (step["park_reason"] for step in view.get("steps", []) if step.get("park_reason")), None
    )


def write_results(phases: list[dict[str, Any]], arguments: dict[str, Any]) -> None:
    """The results file as it stands: rewritten after every phase, so a later failure keeps
    what was measured."""
    RESULTS.mkdir(exist_ok=True)
    document = {
        "title": "Provider brownout: the fleet-wide retry budget",
        "run": run_info(
            n_per_arm=arguments["tasks"],
            concurrency=arguments["tasks"],
            rounds=1,
            arguments=arguments,
        ),
        "tasks": arguments["tasks"],
        "brownout_seconds": arguments["brownout_seconds"],
        "observe_seconds": OBSERVE_SECONDS,
        "workers": COPIES,
        "gateways": COPIES,
        "target_posts_per_task": TARGET_POSTS_PER_TASK,
        "phases": {f"{phase['fault']} {phase['mode']}": phase for phase in phases},
    }
    RESULTS_FILE.write_text(json.dumps(document, indent=2) + "\n")


def print_summary(phases: Sequence[dict[str, Any]]) -> None:
    print(f"\n== provider brownout ==  ({machine()})")
    print(
        f"  {'fault':<11} {'budget':<6} {'tasks':>5} {'POSTs':>6} {'/task':>6} "
        f"{'ok≤60s':>6} {'last s':>7} {'parked':>6} {'failed':>6} {'running':>7}  safety"
    )
    for p in phases:
        last = p["last_success_after_recovery_s"]
        print(
            f"  {p['fault']:<11} {p['mode']:<6} {p['tasks']:>5} {p['posts_during_brownout']:>6} "
            f"{p['posts_per_task']:>6.2f} {p['succeeded_within_60s']:>6} "
            f"{'-' if last is None else f'{last:.1f}':>7} {p['parked']:>6} {p['failed']:>6} "
            f"{p['still_running']:>7}  {'held' if p['safety']['held'] else 'BROKEN'}"
        )


async def main(
    tasks: int, brownout_seconds: float, modes: list[str], faults: list[str]
) -> list[dict[str, Any]]:
    arguments = {
        "tasks": tasks,
        "brownout_seconds": brownout_seconds,
        "modes": modes,
        "faults": faults,
    }
    phases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="onceflow-brownout-") as directory:
        for fault_name in faults:
            for mode in modes:
                scratch = Path(directory) / f"{fault_name}-{mode}"
                scratch.mkdir()
                print(f"phase: fault {fault_name}, budget {mode} ...", flush=True)
                phase = await run_phase(scratch, fault_name, mode, tasks, brownout_seconds)
                phases.append(phase)
                write_results(phases, arguments)
                print(
                    f"  {phase['posts_during_brownout']} POSTs during the brownout "
                    f"({phase['posts_per_task']:.2f} per task); at the end "
                    f"{phase['states_at_end']}",
                    flush=True,
                )
    print_summary(phases)
    return phases


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--brownout-seconds", type=float, default=30.0)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["on", "off"])
    parser.add_argument("--faults", nargs="+", choices=list(FAULTS), default=["500", "429"])
    parsed = parser.parse_args()
    asyncio.run(main(parsed.tasks, parsed.brownout_seconds, parsed.modes, parsed.faults))
