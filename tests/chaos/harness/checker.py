"""The chaos run's checker: once the faults healed, the run's history against the far
sides' own records (provider ledger and request log, the SMTP sink's applied
Message-IDs, the deployment target's writes, PostgreSQL's business rows), then every
task's history replayed from its first event; the result is the :class:`ChaosReport`.

Every acknowledged task's succeeded steps have exactly one effect, failed steps none,
parked steps their evidence; no key has more than one task or effect; no effect belongs
to no task; none is stuck (a task parked at the end, its key window closed say, is
parked, not stuck). Open tasks are checked by :mod:`.checker_open_tasks`, the provider's
request log and the key windows by :mod:`.checker_key_windows`.
"""

import asyncio
from collections import Counter, defaultdict
from typing import Any

import httpx
import psycopg
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from onceflow.task_api import connect_temporal
from onceflow.workflows import AgentTaskWorkflow
from tests.harness import replay_every_task, settled_count

from .checker_key_windows import KeyWindows
from .checker_open_tasks import OpenTaskCheck
from .config import OPEN_TASK
from .context import RunContext
from .records import ChaosReport, TaskRecord


class Checker:
    """Checks one run's history once its tasks have ended (see :meth:`check`)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.stack = ctx.stack
        self.windows = KeyWindows(ctx)
        self.open_tasks = OpenTaskCheck(ctx, self.windows)

    async def check(self) -> ChaosReport:
        self.ctx.say("checking the history against the far sides' records")
        async with httpx.AsyncClient(timeout=30) as http:
            ledger = (await http.get(f"{self.stack.far['provider_url']}/_test/ledger")).json()[
                "data"
            ]
            requests = (await http.get(f"{self.stack.far['provider_url']}/_test/requests")).json()[
                "data"
            ]
            sink = (await http.get(f"{self.stack.far['smtp_control_url']}/messages")).json()
            target = (await http.get(f"{self.stack.far['deploy_target_url']}/deployments")).json()
        with psycopg.connect(self.stack.database_url, autocommit=True) as conn:
            coupons = Counter(
                user
                for (user,) in conn.execute(
                    "SELECT user_id FROM coupon_issuances WHERE tenant = %s", (self.ctx.tenant,)
                )
            )
            orders = Counter(
                customer
                for (customer,) in conn.execute(
                    "SELECT customer_id FROM orders WHERE tenant = %s", (self.ctx.tenant,)
                )
            )
            generations = {
                child_key: (workflow_id, step_id, child_op, int(generation or 1))
                for child_key, workflow_id, step_id, child_op, generation in conn.execute(
                    "SELECT child_key, workflow_id, step_id, child_op,"
                    " correlation->>'key_generation' FROM operations"
                    " WHERE tenant = %s AND tool IN ('charge_payment', 'refund_payment')",
                    (self.ctx.tenant,),
                )
            }
            records = defaultdict(list)
            call_records = defaultdict(list)
            for key, scope, workflow_id, resource_id, state in conn.execute(
                "SELECT idempotency_key, scope, workflow_id, resource_id, state"
                " FROM idempotency_records WHERE tenant = %s",
                (self.ctx.tenant,),
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

        client = await connect_temporal(address=self.stack.temporal.endpoints.address)
        violations = list(self.ctx.violations)
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
        violations.extend(self.windows.expired_key_sends(requests))
        violations.extend(self.windows.retired_key_sends(requests, generations))
        claimed: set[str] = set()
        for record in self.ctx.records:
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
                found_violations, found_stuck = self.open_tasks.check_open_task(
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
                self.ctx.figures[f"failed tasks: {cause['tool']} step {cause['state']}"] += 1
            for step in status["steps"]:
                self.windows.count_key_window(status["workflow_id"], step)
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
        known_orders = {f"ord-{r.number}" for r in self.ctx.records}
        known_orders |= {
            str(call.arguments["order_id"])
            for r in self.ctx.records
            for call in r.calls
            if call.tool == "charge_payment"
        }
        for order_id in charges:
            if order_id not in known_orders:
                violations.append(f"charge for unknown order {order_id}")
        for deployment_id in deployments:
            if deployment_id not in claimed:
                violations.append(f"deployment {deployment_id} belongs to no task")
        self.windows.count_late_first_sends(requests, generations)
        # Every task's history replays from its first event as it ran, after the kills,
        # pauses and restarts: a divergence is a task stuck for good at its next replay.
        replays = await replay_every_task(client, "the chaos run's Temporal server")
        violations += [f"replay diverged: {line}" for line in replays.diverged]
        violations += [f"history not replayable: {line}" for line in replays.not_replayable]
        self.ctx.figures["task histories replayed from their first event"] = replays.replayed
        workflows = await self.count_workflows(client)
        acknowledged = sum(1 for r in self.ctx.records if r.acknowledged)
        if workflows != acknowledged:
            violations.append(f"{workflows} task workflows for {acknowledged} acknowledged keys")
        figures: dict[str, Any] = {
            "tasks (keys)": len(self.ctx.records),
            "acknowledged": acknowledged,
            "task workflows in Temporal": workflows,
            "provider ledger entries": len(ledger),
            "emails applied at the sink": len(applications),
            "emails received (incl. redeliveries)": len(sink["received"]),
            "deployments applied at the target": len(deployments),
            "deployment writes refused by the fence": sum(
                1 for d in target["deployments"] for w in d["writes"] if not w["applied"]
            ),
            **self.ctx.durations,
            **self.ctx.recovery.figures(),
            **dict(sorted(self.ctx.figures.items())),
        }
        return ChaosReport(self.ctx.config, self.ctx.records, figures, violations, stuck, per_tool)

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
        query = f"WorkflowType = 'AgentTaskWorkflow' AND OnceflowTenant = '{self.ctx.tenant}'"
        return await settled_count(client, query, timeout=30)
