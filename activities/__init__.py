"""All I/O of the tools: one module per tool family, each returning a classified outcome.

Activities never decide to retry; the workflow's budget does.
"""

from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from activities.coupons import CouponActivities
from activities.orders import OrderActivities

__all__ = ["CouponActivities", "OrderActivities", "build_activities"]


def build_activities(pool: AsyncConnectionPool) -> list[Callable[..., Any]]:
    """Every reference tool's activity, bound to the given clients."""
    coupons = CouponActivities(pool)
    orders = OrderActivities(pool)
    return [coupons.issue_coupon, orders.create_order]
