"""Performs ``create_order``: the order and its succeeded record commit together."""

import uuid
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from temporalio import activity

from onceflow.retry_policy import OutcomeClass
from onceflow.storage import classify_database_error
from onceflow.tools import (
    CREATE_ORDER,
    CreateOrderInput,
    ToolAttemptResult,
    ToolCallInput,
    derive_child_key,
    key_digest,
)

LOCAL_ACCOUNT = "onceflow-db"
"""The 'provider account' of effects in onceflow's own database."""

_CLAIM = """
INSERT INTO operations
    (child_key, tenant, workflow_id, step_id, tool, child_op, state, resource_id, result)
VALUES (%(child_key)s, %(tenant)s, %(workflow_id)s, %(step_id)s, %(tool)s, 'create_order',
        'succeeded', %(order_id)s, %(result)s)
ON CONFLICT (child_key) DO NOTHING
RETURNING child_key
"""
_EARLIER = "SELECT resource_id, result FROM operations WHERE child_key = %(child_key)s"
_ORDER = """
INSERT INTO orders (order_id, tenant, customer_id, currency, total_cents, child_key)
VALUES (%(order_id)s, %(tenant)s, %(customer_id)s, %(currency)s, %(total_cents)s, %(child_key)s)
"""
_LINE = """
INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
VALUES (%s, %s, %s, %s, %s)
"""


class OrderActivities:
    """The order tool's activity, bound to the worker's connection pool."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool

    @activity.defn(name=CREATE_ORDER.name)
    async def create_order(self, call: ToolCallInput) -> ToolAttemptResult:
        """Create the order once per task step; a repeat returns the first result.

        The documented result: ``order_id``, ``total_cents``, ``currency`` and
        ``replayed`` (true when an earlier attempt of this step had created it).
        """
        arguments = CreateOrderInput.model_validate(call.arguments)
        child_key = derive_child_key(
            tenant=call.tenant,
            workflow_id=call.workflow_id,
            step_id=call.step_id,
            child_op="create_order",
            provider_account=LOCAL_ACCOUNT,
        )
        order_id = uuid.uuid4()
        total = sum(line.quantity * line.unit_price_cents for line in arguments.lines)
        result: dict[str, Any] = {
            "order_id": str(order_id),
            "total_cents": total,
            "currency": arguments.currency,
        }
        params = {
            "child_key": child_key,
            "tenant": call.tenant,
            "workflow_id": call.workflow_id,
            "step_id": call.step_id,
            "tool": call.tool,
            "order_id": str(order_id),
            "customer_id": arguments.customer_id,
            "currency": arguments.currency,
            "total_cents": total,
            "result": Jsonb(result),
        }
        evidence = {"child_key_digest": key_digest(child_key)}
        try:
            async with self._pool.connection() as conn, conn.transaction():
                claimed = await (await conn.execute(_CLAIM, params)).fetchone()
                if claimed is None:
                    earlier = await (await conn.execute(_EARLIER, params)).fetchone()
                    if earlier is None:
                        raise LookupError("operation record vanished")
                    return ToolAttemptResult(
                        outcome=OutcomeClass.SUCCEEDED,
                        resource_id=earlier[0],
                        result={**earlier[1], "replayed": True},
                        evidence=evidence,
                    )
                await conn.execute(_ORDER, params)
                async with conn.cursor() as cursor:
                    await cursor.executemany(
                        _LINE,
                        [
                            (order_id, number, line.sku, line.quantity, line.unit_price_cents)
                            for number, line in enumerate(arguments.lines, start=1)
                        ],
                    )
        except Exception as error:  # every failure is classified, none escapes unlabelled
            outcome, reason = classify_database_error(error)
            return ToolAttemptResult(outcome=outcome, reason=reason, evidence=evidence)
        return ToolAttemptResult(
            outcome=OutcomeClass.SUCCEEDED,
            resource_id=str(order_id),
            result={**result, "replayed": False},
            evidence=evidence,
        )
