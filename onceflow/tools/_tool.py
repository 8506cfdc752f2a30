"""A tool: its contract plus the code that performs it, checked before registering."""

import inspect
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from onceflow.tools._attempts import ToolAttemptResult
from onceflow.tools._call import ToolCall
from onceflow.tools._checks import Problem, contract_problems
from onceflow.tools._contract import ToolContract

Implementation = Callable[[ToolCall[Any]], Awaitable[ToolAttemptResult]]
"""An async function performing one attempt (or one lookup) and classifying its outcome."""
ClientOpener = Callable[[], AbstractAsyncContextManager[Any]]
"""Opens the tool's client once per worker; what it yields is ``ToolCall.client``."""


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool: what it does to the world, and how. onceflow's own tools are built the same
    way (``onceflow.payments.payment_tools``, ``onceflow.deployments.deployment_tools``, …).

    Example::

        CREATE_TICKET = Tool(
            contract=ToolContract(name="create_ticket", ..., start_to_close_timeout=...),
            perform=create_ticket,
            look_up=look_up_ticket,
            open_client=open_ticketdesk_client,
        )

    Point ``ONCEFLOW_TOOLS`` (or an ``onceflow.tools`` entry point) at it.
    """

    contract: ToolContract
    """Name, input model, effect flags, dedupe strategy, timeouts, approval rule."""
    perform: Implementation
    """Makes one attempt. Returns a classified ``ToolAttemptResult``; an exception it
    raises counts as ``unknown`` (``NothingSent`` as ``transient``)."""
    look_up: Implementation | None = None
    """Looks the effect up by its correlation ids before a step parks, and to check an
    operator's decision: ``succeeded`` when found; a miss says what it proves
    (``ToolAttemptResult.miss_proves_absence`` for a consistent read,
    ``miss_proves_absence_after`` for an eventual one), else ``did_not_happen`` needs
    ``--unverified``. Registered as activity ``look_up_<name>``. Default None (an
    unknown outcome that cannot be repeated parks at once)."""
    open_client: ClientOpener | None = None
    """Opens the client ``perform`` and ``look_up`` use, once per worker process. Its
    retries must be off (onceflow checks the httpx and requests clients it can see, and
    those of every library a loaded family declares a ``ClientRetryCheck`` for).
    Default None (``ToolCall.client`` is None)."""

    @property
    def name(self) -> str:
        """The tool's name (the contract's)."""
        return self.contract.name

    @property
    def registered_contract(self) -> ToolContract:
        """The contract as registered: it names the lookup activity when there is one."""
        if self.look_up is None:
            return self.contract
        return replace(self.contract, lookup_activity=lookup_activity_name(self.contract.name))


def lookup_activity_name(tool_name: str) -> str:
    """The activity name of a custom tool's lookup."""
    return f"look_up_{tool_name}"


def tool_problems(tool: object) -> list[Problem]:
    """Every mistake of a would-be tool, contract and implementation, each with a fix."""
    if not isinstance(tool, Tool):
        return [
            (
                f"it is a {type(tool).__name__}, not an onceflow.tools.Tool",
                "point the setting at a Tool (or a list of Tools, or a function returning them)",
            )
        ]
    problems = contract_problems(tool.contract)
    if not inspect.iscoroutinefunction(tool.perform):
        problems.append(
            ("perform is not an async function", "define it with `async def perform(call)`")
        )
    if tool.look_up is not None and not inspect.iscoroutinefunction(tool.look_up):
        problems.append(
            ("look_up is not an async function", "define it with `async def look_up(call)`")
        )
    if tool.look_up is None and tool.contract.lookup_activity is not None:
        problems.append(
            (
                f"the contract names lookup activity {tool.contract.lookup_activity!r} but "
                "the tool has no look_up",
                "pass look_up=… to Tool and leave the contract's lookup_activity unset",
            )
        )
    if tool.open_client is not None and not callable(tool.open_client):
        problems.append(
            (
                "open_client is not callable",
                "pass a function returning an async context manager (e.g. an @asynccontextmanager)",
            )
        )
    return problems
