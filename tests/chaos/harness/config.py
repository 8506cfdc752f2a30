"""The chaos run's settings: its size and fault rates (:class:`ChaosConfig`), the tools
it drives, and the far sides' and the stack's timings every part of the run agrees on.

``bench/write_benchmarks.py`` reads :class:`ChaosConfig`'s defaults from this file's
source (it imports no part of the stack), to say how a recorded run differs from today's.
"""

from dataclasses import dataclass
from typing import Any

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
POSTGRES_OUTAGE_SECONDS = 30.0
"""How long PostgreSQL stays down in the run's restart while agents keep sending (and at
least until both gateways answer 503 for it): three times a gateway's 10 s pool wait, so
callers time out, retry and are cancelled while it is down, as in the restart under load
that once left a gateway serving nothing for good (issue #39)."""
GATEWAY_PROBE_TIMEOUT = 10.0
"""The run's own ``GET /readyz`` timeout: above the gateways' readiness timeout (2 s), as
a load balancer's probe must be, so a 503 says not ready and only a hang times out."""


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
        gateway_kill_every_tasks: Tasks that end between gateway SIGKILLs (0: none): the
            two gateways in turn, each replaced on its port at once; then every gateway
            must be ready and answer a real request 2xx again. Default 40.
        pause_worker_at: Share of tasks submitted when a worker is SIGSTOPped for
            ``PAUSE_SECONDS`` (past the provider's key retention), then SIGCONTed (None:
            never). Default 0.15.
        restart_temporal_at: Share of tasks submitted when the Temporal dev server is
            restarted (None: never). Default 0.45.
        restart_postgres_at: Share of tasks submitted when PostgreSQL is stopped, held
            down ``POSTGRES_OUTAGE_SECONDS`` while agents keep sending, and started again
            on the same data folder; then every gateway must be ready and answer a real
            request 2xx again (None: never). Default 0.7.
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
    gateway_kill_every_tasks: int = 40
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
