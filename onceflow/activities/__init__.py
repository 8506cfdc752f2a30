"""The composition of every activity a worker runs: the built-in tools (each family built
on the public tool API, like a user's tool), the configured custom tools, and the
boundary's record activities.

Activities never decide to retry; the workflow's budget does.
"""

from onceflow.activities.idempotency_records import IdempotencyRecordActivities
from onceflow.configuration import OnceflowConfiguration
from onceflow.coupons import coupon_tools
from onceflow.deployments import deployment_tools
from onceflow.email import email_tools
from onceflow.orders import order_tools
from onceflow.payments import payment_tools
from onceflow.tools import Tool, load_tools

__all__ = [
    "IdempotencyRecordActivities",
    "builtin_tools",
    "configured_tools",
    "missing_services",
]


def builtin_tools(configuration: OnceflowConfiguration) -> tuple[Tool, ...]:
    """The built-in tools this deployment serves (``[onceflow] builtin_tools``, default all
    six: ``issue_coupon``, ``create_order``, ``charge_payment``, ``refund_payment``,
    ``send_email``, ``start_deployment``), each family built from its sections of
    ``configuration``.

    Raises:
        ValueError: A family refuses its settings (the payment tools' attempt timeout
            does not fit two Stripe calls).
    """
    every = (
        *coupon_tools(),
        *order_tools(),
        *payment_tools(configuration.payment_tool, configuration.stripe),
        *email_tools(configuration.email_tool, configuration.email),
        *deployment_tools(configuration.deployment_tool, configuration.deploy_target),
    )
    served = set(configuration.onceflow.builtin_tools)
    return tuple(tool for tool in every if tool.name in served)


def missing_services(configuration: OnceflowConfiguration) -> list[str]:
    """One line per service a served built-in tool needs and the configuration lacks, each
    with its fix; empty when a worker can serve every tool it is configured for.

    A worker refuses to start rather than serve a tool that could only fail: the payment
    tools need ``STRIPE_API_KEY``, ``start_deployment`` needs ``DEPLOY_TARGET_URL``.
    (``send_email`` needs nothing here: relays deliver, and they need ``SMTP_URL``.)
    """
    served = set(configuration.onceflow.builtin_tools)
    needs = (
        (
            ("charge_payment", "refund_payment"),
            configuration.stripe.configured,
            "STRIPE_API_KEY is not set",
            "set it to your Stripe secret key (and STRIPE_API_BASE only to point elsewhere)",
        ),
        (
            ("start_deployment",),
            configuration.deploy_target.url is not None,
            "DEPLOY_TARGET_URL is not set",
            "set it to your deployment target's URL",
        ),
    )
    problems = []
    for tools, present, missing, fix in needs:
        wanted = [tool for tool in tools if tool in served]
        if wanted and not present:
            others = [tool for tool in configuration.onceflow.builtin_tools if tool not in tools]
            problems.append(
                f"{missing}, but this worker serves {' and '.join(wanted)}; fix: {fix}, or "
                f"leave {'them' if len(wanted) > 1 else 'it'} out: "
                f"ONCEFLOW_BUILTIN_TOOLS={','.join(others)}"
            )
    return problems


def configured_tools(configuration: OnceflowConfiguration) -> tuple[Tool, ...]:
    """Every tool of a process: the built-in ones and the custom tools of
    ``[onceflow] tools`` (``ONCEFLOW_TOOLS``), in that order. What each entry point
    registers with ``register_tools`` at start-up, so the worker, the gateway and the
    MCP server agree on what exists.

    Raises:
        ToolRegistrationError: A custom tool cannot be loaded or is unsafe, with the fix.
    """
    return (*builtin_tools(configuration), *load_tools(configuration.onceflow.tools))
