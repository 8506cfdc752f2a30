"""The ``issue_coupon`` tool: a unique constraint on ``(user_id, coupon_id)`` dedupes it.

Built on the public tool API like any user's tool: ``coupon_tools()`` returns it for the
worker, the gateway and the MCP server to register.
"""

from onceflow.coupons._contract import ISSUE_COUPON_CONTRACT, IssueCouponInput
from onceflow.coupons._perform import issue_coupon
from onceflow.tools import Tool, ToolFamily

__all__ = ["ISSUE_COUPON_CONTRACT", "IssueCouponInput", "coupon_family", "coupon_tools"]


def coupon_tools() -> tuple[Tool, ...]:
    """The coupon family's tools: ``issue_coupon``. It needs no settings and no client."""
    return (Tool(contract=ISSUE_COUPON_CONTRACT, perform=issue_coupon),)


def coupon_family() -> ToolFamily:
    """The coupon family as every process loads it: its tools; it needs no service."""
    return ToolFamily(name="coupons", tools=coupon_tools())
