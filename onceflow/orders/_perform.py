"""Performs ``create_order``: the order and its succeeded record commit together."""

import uuid
from typing import Any

from psycopg import AsyncConnection

from onceflow.orders._contract import CreateOrderInput
from onceflow.tools import ToolAttemptResult, ToolCall

LOCAL_ACCOUNT = "onceflow-db"
"""The 'provider account' of effects in onceflow's own database."""
CHILD_OP = "create_order"
"""The child operation of an order in its derived key."""

_ORDER = """
INSERT INTO orders (order_id, tenant, customer_id, currency, total_cents, child_key)
VALUES (%(order_id)s, %(tenant)s, %(customer_id)s, %(currency)s, %(total_cents)s, %(child_key)s)
"""
_LINE = """
INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
VALUES (%s, %s, %s, %s, %s)
"""


async def create_order(call: ToolCall[CreateOrderInput]) -> ToolAttemptResult:
    """Create the order once per task step; a repeat returns the first result.

    The documented result: ``order_id``, ``total_cents``, ``currency`` and
    ``replayed`` (true when an earlier attempt of this step had created it).
    """
    arguments = call.args
    operation = await call.begin(CHILD_OP, provider_account=LOCAL_ACCOUNT)
    if operation.earlier_success:
        return _replayed(operation.earlier_success, replayed=True)
    order_id = str(uuid.uuid4())
    total = sum(line.quantity * line.unit_price_cents for line in arguments.lines)

    async def insert_order(conn: AsyncConnection[Any]) -> None:
        await conn.execute(
            _ORDER,
            {
                "order_id": order_id,
                "tenant": call.tenant,
                "customer_id": arguments.customer_id,
                "currency": arguments.currency,
                "total_cents": total,
                "child_key": operation.key,
            },
        )
        async with conn.cursor() as cursor:
            await cursor.executemany(
                _LINE,
                [
                    (order_id, number, line.sku, line.quantity, line.unit_price_cents)
                    for number, line in enumerate(arguments.lines, start=1)
                ],
            )

    committed = await operation.commit_local_effect(
        insert_order,
        order_id,
        {"order_id": order_id, "total_cents": total, "currency": arguments.currency},
    )
    # Another attempt of this step may have committed first: then its order is reported.
    return _replayed(committed, replayed=committed.resource_id != order_id)


def _replayed(attempt: ToolAttemptResult, *, replayed: bool) -> ToolAttemptResult:
    if attempt.resource_id is None:  # not a success: nothing to mark
        return attempt
    return attempt.model_copy(update={"result": {**attempt.result, "replayed": replayed}})
