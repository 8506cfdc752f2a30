"""Tool contracts (pure data) and the catalogue the workflow and the boundary share.

``CATALOGUE`` holds the reference tools; a worker may register more before it starts.
"""

from tools._attempts import ToolAttemptResult, ToolCallInput
from tools._catalogue import Catalogue, UnknownTool
from tools._checks import ToolRegistrationError
from tools._contract import ApprovalThreshold, DedupeStrategy, EffectFlags, ToolContract
from tools._identity import (
    IDEMPOTENCY_KEY_MAX_LENGTH,
    MalformedIdempotencyKey,
    arguments_digest,
    check_idempotency_key,
    derive_child_key,
    derive_task_workflow_id,
    key_digest,
)
from tools.coupons import ISSUE_COUPON, IssueCouponInput
from tools.deployments import START_DEPLOYMENT, StartDeploymentInput
from tools.email import SEND_EMAIL, SendEmailInput
from tools.orders import CREATE_ORDER, CreateOrderInput, OrderLine
from tools.payments import (
    CHARGE_PAYMENT,
    REFUND_PAYMENT,
    ChargePaymentInput,
    PaymentToolSettings,
    RefundPaymentInput,
)

CATALOGUE = Catalogue(
    (
        ISSUE_COUPON,
        CREATE_ORDER,
        CHARGE_PAYMENT,
        REFUND_PAYMENT,
        SEND_EMAIL,
        START_DEPLOYMENT,
    )
)

__all__ = [
    "IDEMPOTENCY_KEY_MAX_LENGTH",
    "CATALOGUE",
    "CHARGE_PAYMENT",
    "CREATE_ORDER",
    "ISSUE_COUPON",
    "REFUND_PAYMENT",
    "SEND_EMAIL",
    "START_DEPLOYMENT",
    "ApprovalThreshold",
    "Catalogue",
    "ChargePaymentInput",
    "CreateOrderInput",
    "DedupeStrategy",
    "EffectFlags",
    "IssueCouponInput",
    "MalformedIdempotencyKey",
    "OrderLine",
    "PaymentToolSettings",
    "RefundPaymentInput",
    "SendEmailInput",
    "StartDeploymentInput",
    "ToolAttemptResult",
    "ToolCallInput",
    "ToolContract",
    "ToolRegistrationError",
    "UnknownTool",
    "arguments_digest",
    "check_idempotency_key",
    "derive_child_key",
    "derive_task_workflow_id",
    "key_digest",
]
