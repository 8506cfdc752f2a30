"""Performs ``issue_coupon``: the unique constraint, not an exists-check, dedupes it."""

import uuid

from onceflow.coupons._contract import IssueCouponInput
from onceflow.tools import (
    OutcomeClass,
    ToolAttemptResult,
    ToolCall,
    autocommit,
    classify_database_error,
)

_ISSUE = """
INSERT INTO coupon_issuances (issuance_id, tenant, user_id, coupon_id, workflow_id, step_id)
VALUES (%(issuance_id)s, %(tenant)s, %(user_id)s, %(coupon_id)s, %(workflow_id)s, %(step_id)s)
ON CONFLICT ON CONSTRAINT one_coupon_per_user DO NOTHING
RETURNING issuance_id
"""

# ON CONFLICT DO NOTHING returns no row; the existing one is read in a new statement,
# which under READ COMMITTED sees the row that won.
_EXISTING = """
SELECT issuance_id, workflow_id, step_id FROM coupon_issuances
WHERE tenant = %(tenant)s AND user_id = %(user_id)s AND coupon_id = %(coupon_id)s
"""


async def issue_coupon(call: ToolCall[IssueCouponInput]) -> ToolAttemptResult:
    """Issue the coupon, or report the issuance that already exists.

    The documented result: ``issuance_id``, ``user_id``, ``coupon_id`` and
    ``already_issued`` (true when another task issued it first).
    """
    arguments = call.args
    params = {
        "issuance_id": uuid.uuid4(),
        "tenant": call.tenant,
        "user_id": arguments.user_id,
        "coupon_id": arguments.coupon_id,
        "workflow_id": call.workflow_id,
        "step_id": call.step_id,
    }
    try:
        # Each statement its own transaction: the INSERT is the whole effect, and the read
        # after a conflict must be a new statement anyway (one round trip, not three).
        async with call.pool.connection() as conn, autocommit(conn):
            inserted = await (await conn.execute(_ISSUE, params)).fetchone()
            if inserted is not None:
                issuance_id, already_issued = inserted[0], False
            else:
                existing = await (await conn.execute(_EXISTING, params)).fetchone()
                if existing is None:  # deleted between the two statements
                    return ToolAttemptResult(
                        outcome=OutcomeClass.TRANSIENT,
                        reason="the conflicting issuance vanished; nothing was written",
                    )
                issuance_id = existing[0]
                # Our own earlier attempt is not "already issued" to the caller.
                already_issued = (existing[1], existing[2]) != (call.workflow_id, call.step_id)
    except Exception as error:  # every failure is classified, none escapes unlabelled
        outcome, reason = classify_database_error(error)
        return ToolAttemptResult(outcome=outcome, reason=reason)
    return ToolAttemptResult(
        outcome=OutcomeClass.SUCCEEDED,
        resource_id=str(issuance_id),
        result={
            "issuance_id": str(issuance_id),
            "user_id": arguments.user_id,
            "coupon_id": arguments.coupon_id,
            "already_issued": already_issued,
        },
    )
