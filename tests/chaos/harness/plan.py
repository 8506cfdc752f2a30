"""The chaos run's workload: which task each agent drives, planned before anything runs.

Tasks spread evenly over the six tools (each a task body for ``POST /v1/tasks`` with a
far-side identity of its own, so effects can be attributed), and a share of open tasks,
each with the calls its agent will send.
"""

import random
from typing import Any

from .config import BIG_REFUND, BUDGET, OPEN_TASK, TOOLS, ChaosConfig
from .records import CallRecord, TaskRecord


def plan(config: ChaosConfig, rng: random.Random) -> list[TaskRecord]:
    """Every task of the run, in the order agents take them."""
    records: list[TaskRecord] = []
    open_tasks = round(config.tasks * config.open_task_share)
    plans = config.tasks - open_tasks
    tools = [TOOLS[n % len(TOOLS)] for n in range(plans)]
    rng.shuffle(tools)
    # An open task keeps its agent for several calls: none starts among the last
    # sixth of the tasks, so the run does not end waiting on one agent's loop.
    for _ in range(open_tasks):
        tools.insert(rng.randint(0, plans * 5 // 6), OPEN_TASK)
    for n, tool in enumerate(tools):
        if tool == OPEN_TASK:
            body, calls = plan_open_task(n, config, rng)
            records.append(TaskRecord(n, tool, f"chaos-{n}", body, calls=calls))
            continue
        record = TaskRecord(n, tool, f"chaos-{n}", plan_task(n, tool, rng))
        record.deny = tool == "start_deployment" and rng.random() < config.deny_share
        records.append(record)
    return records


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
