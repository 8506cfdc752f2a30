"""All I/O of the tools: one module per tool family, each returning a classified outcome.

Activities never decide to retry; the workflow's budget does.
"""

from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from onceflow.activities.coupons import CouponActivities
from onceflow.activities.deployments import DeploymentActivities
from onceflow.activities.email import EmailActivities
from onceflow.activities.idempotency_records import IdempotencyRecordActivities
from onceflow.activities.orders import OrderActivities
from onceflow.activities.payments import PaymentActivities
from onceflow.deployments import DeployTarget
from onceflow.email import EmailSettings
from onceflow.payments import PaymentProvider

__all__ = [
    "CouponActivities",
    "DeploymentActivities",
    "EmailActivities",
    "IdempotencyRecordActivities",
    "OrderActivities",
    "PaymentActivities",
    "build_activities",
]


def build_activities(
    pool: AsyncConnectionPool,
    *,
    payment_provider: PaymentProvider | None = None,
    deploy_target: DeployTarget | None = None,
    email_settings: EmailSettings | None = None,
) -> list[Callable[..., Any]]:
    """Every reference tool's activity, bound to the given clients.

    Without a ``payment_provider`` the payment tools are still registered, so a task
    that calls them fails with a clear reason instead of waiting for a worker forever;
    the same holds for ``start_deployment`` without a ``deploy_target``.
    ``email_settings`` defaults to ``EmailSettings()`` (sender, Message-ID domain).
    """
    coupons = CouponActivities(pool)
    orders = OrderActivities(pool)
    records = IdempotencyRecordActivities(pool)
    payments = PaymentActivities(payment_provider, pool)
    emails = EmailActivities(pool, email_settings or EmailSettings())
    deployments = DeploymentActivities(deploy_target, pool)
    return [
        coupons.issue_coupon,
        orders.create_order,
        payments.charge_payment,
        payments.refund_payment,
        payments.look_up_charge,
        payments.look_up_refund,
        emails.send_email,
        emails.look_up_send_email,
        deployments.start_deployment,
        records.record_task_outcome,
        records.prune_idempotency_records,
    ]
