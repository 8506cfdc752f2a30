"""The composition of every activity a worker runs: the tool families (onceflow's own and
the configured custom ones, loaded by one route, ``onceflow.tools.worker.load_families``), and
the boundary's record activities.

onceflow's own families are named by import path (``configuration.BUILTIN_FAMILIES``), as
``ONCEFLOW_TOOLS`` names a user's, and read their settings sections from the process's
configuration; what each
needs to start, which secrets it redacts and how its client is checked, each family
declares (``onceflow.tools.ToolFamily``), so nothing here knows a family's service.

Activities never decide to retry; the workflow's budget does.
"""

from onceflow.activities.idempotency_records import IdempotencyRecordActivities
from onceflow.configuration import BUILTIN_FAMILIES, OnceflowConfiguration
from onceflow.tools import Tool, ToolFamily
from onceflow.tools.worker import load_families

__all__ = [
    "BUILTIN_FAMILIES",
    "IdempotencyRecordActivities",
    "builtin_families",
    "builtin_tools",
    "configured_families",
    "configured_tools",
    "startup_problems",
]


def builtin_families(configuration: OnceflowConfiguration) -> tuple[ToolFamily, ...]:
    """onceflow's own families, each built from its sections of ``configuration`` and
    narrowed to the tools this deployment serves (``[onceflow] builtin_tools``, default
    all six). Every one is loaded, so its redactions and client checks hold even when
    none of its tools is served.

    Raises:
        ValueError: A family refuses its settings (the payment tools' attempt timeout
            does not fit two Stripe calls).
    """
    served = configuration.onceflow.builtin_tools
    return tuple(
        family.serving(served) for family in load_families(BUILTIN_FAMILIES, configuration)
    )


def builtin_tools(configuration: OnceflowConfiguration) -> tuple[Tool, ...]:
    """The built-in tools this deployment serves (``builtin_families``), in catalogue
    order: ``issue_coupon``, ``create_order``, ``charge_payment``, ``refund_payment``,
    ``send_email``, ``start_deployment``.

    Raises:
        ValueError: A family refuses its settings.
    """
    return tuple(tool for family in builtin_families(configuration) for tool in family.tools)


def configured_families(configuration: OnceflowConfiguration) -> tuple[ToolFamily, ...]:
    """Every family a process serves: onceflow's own (``builtin_families``), then the
    custom ones of ``[onceflow] tools`` (``ONCEFLOW_TOOLS``), their tools in that order.

    Raises:
        ToolRegistrationError: A custom tool cannot be loaded or is unsafe, with the fix.
        ValueError: A built-in family refuses its settings.
    """
    custom = load_families(configuration.onceflow.tools, configuration)
    return (*builtin_families(configuration), *custom)


def configured_tools(configuration: OnceflowConfiguration) -> tuple[Tool, ...]:
    """Every tool of a process, of ``configured_families``. What each entry point
    registers with ``register_tools`` at start-up, so the worker, the gateway and the
    MCP server agree on what exists.

    Raises:
        ToolRegistrationError: A custom tool cannot be loaded or is unsafe, with the fix.
    """
    return tuple(tool for family in configured_families(configuration) for tool in family.tools)


def startup_problems(
    configuration: OnceflowConfiguration, families: tuple[ToolFamily, ...]
) -> list[str]:
    """One line per service a served tool of ``families`` (``configured_families``: the
    custom ones last, one per spec) needs and the configuration lacks, as its family
    declares it (``ToolFamily.problems``), each with its fix; empty when a worker can
    serve every tool it is configured for.

    A worker refuses to start rather than serve a tool that could only fail. The fix names
    the service, or how to leave the tools out: ``ONCEFLOW_BUILTIN_TOOLS`` without them for
    onceflow's own, ``ONCEFLOW_TOOLS`` without the family for a custom one.
    """
    builtin = configuration.onceflow.builtin_tools
    specs = configuration.onceflow.tools
    first_custom = len(families) - len(specs)  # configured_families: the custom ones last
    lines = []
    for index, family in enumerate(families):
        served = [tool.name for tool in family.tools]
        for problem in family.problems:
            wanted = [tool for tool in problem.tools if tool in served]
            if not wanted:
                continue
            if index >= first_custom:
                others = [spec for spec in specs if spec != specs[index - first_custom]]
                leave_out = f"leave the family out: ONCEFLOW_TOOLS={','.join(others)}"
            else:
                others = [tool for tool in builtin if tool not in problem.tools]
                leave_out = (
                    f"leave {'them' if len(wanted) > 1 else 'it'} out: "
                    f"ONCEFLOW_BUILTIN_TOOLS={','.join(others)}"
                )
            lines.append(
                f"{problem.problem}, but this worker serves {' and '.join(wanted)}; fix: "
                f"{problem.fix}, or {leave_out}"
            )
    return lines
