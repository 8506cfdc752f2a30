"""The ``create_order`` tool: no natural key, so the order and its operation record
commit in one transaction (``ChildOperation.commit_local_effect``).

Built on the public tool API like any user's tool: ``order_tools()`` returns it.
"""

from onceflow.orders._contract import CREATE_ORDER_CONTRACT, CreateOrderInput, OrderLine
from onceflow.orders._perform import create_order
from onceflow.tools import Tool, ToolFamily

__all__ = ["CREATE_ORDER_CONTRACT", "CreateOrderInput", "OrderLine", "order_family", "order_tools"]


def order_tools() -> tuple[Tool, ...]:
    """The order family's tools: ``create_order``. It needs no settings and no client."""
    return (Tool(contract=CREATE_ORDER_CONTRACT, perform=create_order),)


def order_family() -> ToolFamily:
    """The order family as every process loads it: its tools; it needs no service."""
    return ToolFamily(name="orders", tools=order_tools())
