"""What ``issue_coupon`` does to the world: one coupon per user, deduped by a natural key."""

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field

from onceflow.tools import DedupeStrategy, EffectFlags, ToolContract

_IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class IssueCouponInput(BaseModel):
    """Give one coupon to one user."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: str = Field(pattern=_IDENTIFIER)
    coupon_id: str = Field(pattern=_IDENTIFIER)


ISSUE_COUPON_CONTRACT = ToolContract(
    name="issue_coupon",
    description="Issue a coupon to a user; a user holds each coupon at most once.",
    input_model=IssueCouponInput,
    effects=EffectFlags(idempotent=True, open_world=False),
    dedupe=DedupeStrategy.NATURAL_KEY,
    # The coupon table's unique (tenant, user, coupon) already is the intent, enforced
    # for every writer: a second call is answered ``already_issued``.
    intent=None,
    start_to_close_timeout=timedelta(seconds=15),
)
"""The ``issue_coupon`` contract; it depends on no setting."""
