"""What ``create_order`` does to the world: one order per step, in onceflow's database."""

from datetime import timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from onceflow.tools import DedupeStrategy, EffectFlags, ToolContract


class OrderLine(BaseModel):
    """One line of an order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sku: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    quantity: int = Field(ge=1, le=10_000)
    unit_price_cents: int = Field(ge=0, le=100_000_000)


class CreateOrderInput(BaseModel):
    """Create one order for a customer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    customer_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
    currency: str = Field(pattern=r"^[a-z]{3}$")
    lines: Annotated[list[OrderLine], Field(min_length=1, max_length=100)]


CREATE_ORDER_CONTRACT = ToolContract(
    name="create_order",
    description="Create an order; the same call in the same task creates it once.",
    input_model=CreateOrderInput,
    effects=EffectFlags(idempotent=True, open_world=False),
    dedupe=DedupeStrategy.LOCAL_TRANSACTION,
    start_to_close_timeout=timedelta(seconds=15),
)
"""The ``create_order`` contract; it depends on no setting."""
