"""The chaos run: many tasks of every tool through the real stack while it is being broken.

What runs (all real processes, nothing mocked)::

    driver (agents.py) ── HTTP ────▶ gateway A, gateway B      (onceflow gateway)
      │  agents retry like agents:       │
      │  same key on timeout / 409 / 5xx ▼
      │                           Temporal dev server (state in a db file)
      │                                  ▼
      │                           worker A, worker B            (onceflow worker)
      │                           relay A, relay B              (onceflow relay)
      │                                  ▼
      └─ faults, records ──▶ far sides (python -m tests.chaos.harness.far_sides):
                             Stripe-compatible provider, SMTP sink, deployment target;
                             PostgreSQL

While agents drive the tasks the run injects, paced by the tasks that end (never by the
clock, so a slower machine meets the same faults per task): SIGKILL of a ready worker (a
replacement is started each time), provider faults (responses dropped or delayed after the
commit, resets, 429/500/503), SMTP faults (connection dropped after DATA with the message
kept or lost, delayed replies, deferred recipients), ``pg_terminate_backend`` on
onceflow's PostgreSQL connections, and faults that never overlap: a gateway SIGKILLed
and replaced on its port (the two in turn), a worker SIGSTOPped for longer than the
provider keeps payment keys (the run shortens that to ``KEY_RETENTION_SECONDS`` at the
provider and in the workers' settings) then SIGCONTed, one restart of the Temporal dev
server (its state persists in its db file), and one restart of PostgreSQL (held down
``POSTGRES_OUTAGE_SECONDS`` while agents keep sending, then started on the same data
folder). After a gateway's restart and PostgreSQL's, every gateway must answer
``GET /readyz`` 200 and a real request 2xx within ``HANG_SECONDS``; one that does not is
a violation naming it. Steps that need approval are approved (a few deployments denied) by an
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

Usage: ``.venv/bin/python -m tests.chaos.harness --tasks 2000 --kill-every-tasks 16
--min-worker-kills 50 --json chaos.json`` (the large run; ``--help`` lists every flag;
exit status 1 on any violation or stuck task, or fewer kills than asked).
``run.run_chaos`` is what ``tests/chaos/test_chaos.py`` calls at CI size.

The modules, one actor or job each; the actors share one ``context.RunContext``
(configuration, HTTP client, figures, violations, logs, the stack):

- ``config``: ``ChaosConfig`` and the timings every part agrees on;
- ``records``: what the run records of each task and call, and ``ChaosReport``;
- ``plan``: the workload, planned before anything runs;
- ``stack``: the processes the run starts (PostgreSQL, Temporal, far sides, gateways,
  relays, workers) and the supervisor that keeps two workers;
- ``far_sides``: the far sides' own process (``python -m tests.chaos.harness.far_sides``);
- ``agents``: task drivers that open tasks and send calls over HTTP;
- ``operators``: the operator's status reads, approvals and reconciliations;
- ``faults``: the fault injectors;
- ``recovery``: recovery time per kind of fault;
- ``checker``, ``checker_open_tasks``, ``checker_key_windows``: the end-of-run check;
- ``run``: one run from start to end (``run_chaos``);
- ``__main__``: the command line.

This package's ``__init__`` imports nothing, so the far sides' process starts without
the stack's imports: import from the modules.
"""
