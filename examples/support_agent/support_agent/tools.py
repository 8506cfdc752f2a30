"""support_agent's onceflow tool: ``look_up_order``, a read the agent needs before it acts.

It changes nothing in the world, so every failed attempt is ``transient`` (known to have
had no effect) and onceflow's budget may repeat it: no dedupe strategy is needed, and an
unknown outcome, which would park, never arises. A missing order is ``rejected``: the
model is told so and may correct the order id. The shop's orders table sits in onceflow's
PostgreSQL, which every attempt reaches through ``call.pool``.

Registered by configuration: ``ONCEFLOW_TOOLS=support_agent`` (the entry point this
package declares) on the worker, the gateway and the MCP server.
"""

from datetime import timedelta

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import BaseModel, ConfigDict, Field

from onceflow.tools import (
    DedupeStrategy,
    EffectFlags,
    OutcomeClass,
    Tool,
    ToolAttemptResult,
    ToolCall,
    ToolContract,
)
from support_agent.shop import ORDER_ID_PATTERN, find_order


class LookUpOrderInput(BaseModel):
    """Which order to look up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order_id: str = Field(pattern=ORDER_ID_PATTERN)
    """The shop's order id (``ord-…``), as the customer quotes it."""


async def look_up_order(call: ToolCall[LookUpOrderInput]) -> ToolAttemptResult:
    """One read of the order: its customer, amount and the PaymentIntent that paid it."""
    try:
        order = await find_order(call.pool, call.args.order_id)
    except (psycopg.Error, PoolTimeout) as failure:
        # A read that failed changed nothing, whatever the failure: safe to repeat.
        return ToolAttemptResult(
            outcome=OutcomeClass.TRANSIENT,
            reason=f"the order could not be read ({type(failure).__name__})",
        )
    if order is None:
        return ToolAttemptResult(
            outcome=OutcomeClass.REJECTED, reason=f"the shop has no order {call.args.order_id}"
        )
    return ToolAttemptResult(
        outcome=OutcomeClass.SUCCEEDED,
        resource_id=order.order_id,
        result={
            "order_id": order.order_id,
            "customer_email": order.customer_email,
            "item": order.item,
            "amount": order.amount,
            "currency": order.currency,
            "payment_intent": order.payment_intent,
        },
    )


LOOK_UP_ORDER = Tool(
    contract=ToolContract(
        name="look_up_order",
        description=(
            "Look an order up by its id: the customer's email, the item, the amount paid "
            "(minor units) and the Stripe PaymentIntent that paid it. Changes nothing."
        ),
        input_model=LookUpOrderInput,
        effects=EffectFlags(read_only=True, open_world=False),
        # Nothing to dedupe: a read has no effect to repeat, and it never reports unknown.
        dedupe=DedupeStrategy.NONE,
        start_to_close_timeout=timedelta(seconds=10),
    ),
    perform=look_up_order,
)

TOOLS = (LOOK_UP_ORDER,)
"""What the ``onceflow.tools`` entry point ``support_agent`` names."""
