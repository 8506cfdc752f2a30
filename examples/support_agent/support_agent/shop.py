"""The shop's side: its orders table, and a checkout that charges the card through onceflow.

The table lives in onceflow's PostgreSQL (a tool's own tables may), so the
``look_up_order`` tool reads it through the pool onceflow gives every attempt. The
checkout is keyed by the order id: running it again for the same order is the same
charge, never a second one.

    python -m support_agent.shop --database-url URL --gateway URL --api-key KEY \\
        --customer-email ada@example.com --amount 2500
"""

import argparse
import asyncio
import json
import os
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

if TYPE_CHECKING:
    # The worker imports this module for the tool, and needs no client there.
    from onceflow_client import OnceflowClient

ORDER_ID_PATTERN = r"^ord-[A-Za-z0-9-]{1,60}$"
ORDERS_TABLE = """
    CREATE TABLE IF NOT EXISTS support_agent_orders (
        order_id       text PRIMARY KEY,
        customer_email text NOT NULL,
        item           text NOT NULL,
        amount         bigint NOT NULL CHECK (amount > 0),
        currency       text NOT NULL,
        payment_intent text NOT NULL,
        ordered_at     timestamptz NOT NULL DEFAULT now()
    )
"""


@dataclass(frozen=True)
class Order:
    """One order as the shop keeps it."""

    order_id: str
    customer_email: str
    item: str
    amount: int
    """Minor units (cents)."""
    currency: str
    payment_intent: str
    """The Stripe PaymentIntent that took the money."""


async def find_order(pool: AsyncConnectionPool, order_id: str) -> Order | None:
    """The order, or None when the shop has no such order (or no orders at all yet)."""
    async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
        try:
            await cursor.execute(
                "SELECT order_id, customer_email, item, amount, currency, payment_intent "
                "FROM support_agent_orders WHERE order_id = %s",
                (order_id,),
            )
        except psycopg.errors.UndefinedTable:
            return None
        row = await cursor.fetchone()
    return Order(**row) if row else None


async def checkout(
    onceflow: "OnceflowClient",
    database_url: str,
    *,
    customer_email: str,
    amount: int,
    currency: str = "usd",
    item: str = "a ceramic teapot",
    order_id: str | None = None,
) -> Order:
    """Charge the customer through onceflow's ``charge_payment``, then record the order.

    Raises:
        RuntimeError: The charge did not succeed.
    """
    order_id = order_id or f"ord-{uuid.uuid4().hex[:10]}"
    charged = await onceflow.call_tool(
        "charge_payment",
        {
            "amount": amount,
            "currency": currency,
            "customer": "cus_support_demo",
            "payment_method": "pm_card_visa",
            "order_id": order_id,
        },
        idempotency_key=f"checkout-{order_id}",
    )
    charged = await onceflow.wait(charged, timeout=60, poll_interval=0.2)
    if charged.state != "succeeded" or not charged.steps[-1].get("resource_id"):
        raise RuntimeError(f"the charge for {order_id} is {charged.state}")
    order = Order(
        order_id=order_id,
        customer_email=customer_email,
        item=item,
        amount=amount,
        currency=currency,
        payment_intent=str(charged.steps[-1]["resource_id"]),
    )
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(ORDERS_TABLE)
        await conn.execute(
            "INSERT INTO support_agent_orders "
            "(order_id, customer_email, item, amount, currency, payment_intent) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (order_id) DO NOTHING",
            (
                order.order_id,
                order.customer_email,
                order.item,
                order.amount,
                order.currency,
                order.payment_intent,
            ),
        )
    return order


def main(argv: list[str] | None = None) -> None:
    """Place one order and print it as JSON."""
    parser = argparse.ArgumentParser(prog="python -m support_agent.shop", description=__doc__)
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument(
        "--gateway", default=os.environ.get("ONCEFLOW_GATEWAY_URL", "http://127.0.0.1:8080")
    )
    parser.add_argument("--api-key", default=os.environ.get("ONCEFLOW_API_KEY"))
    parser.add_argument("--customer-email", default="ada@example.com")
    parser.add_argument("--amount", type=int, default=2500, help="Minor units (cents).")
    parser.add_argument("--order-id", default=None)
    args = parser.parse_args(argv)
    if not args.database_url or not args.api_key:
        parser.error("--database-url and --api-key (or DATABASE_URL, ONCEFLOW_API_KEY) are needed")

    async def place() -> dict[str, Any]:
        from onceflow_client import OnceflowClient

        async with OnceflowClient(args.gateway, api_key=args.api_key) as onceflow:
            order = await checkout(
                onceflow,
                args.database_url,
                customer_email=args.customer_email,
                amount=args.amount,
                order_id=args.order_id,
            )
        return asdict(order)

    print(json.dumps(asyncio.run(place())))


if __name__ == "__main__":
    main()
