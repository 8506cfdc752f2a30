"""A tool family: the tools one package brings, with what onceflow must know about their
services: what a worker cannot start without, which secrets to keep out of logs, traces
and histories, and how to see that its clients retry nothing.

onceflow's own families (coupons, orders, payments, email, deployments) are loaded the same
way as a user's, so every check below applies to both alike. A family is registered here
when it is loaded (``load_families``): its redactions and client checks then hold in the
whole process, whatever tools of it the process serves.
"""

import re
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from typing import Any

from psycopg_pool import AsyncConnectionPool

from onceflow.tools._audit import Auditor
from onceflow.tools._checks import Problem
from onceflow.tools._tool import Tool

OpenAuditor = Callable[[AsyncConnectionPool], AbstractAsyncContextManager[Auditor | None]]
"""How a family opens its audit against its provider, given onceflow's database: a
context that yields the ``Auditor`` (its provider client open for as long), or None when
this process's settings lack the provider (the family's start-up problems say what)."""


@dataclass(frozen=True, kw_only=True)
class StartupProblem:
    """A service some of a family's tools need and this process's settings lack: a worker
    serving any of ``tools`` refuses to start with one line naming it and its fix.

    Example::

        StartupProblem(
            tools=("ledgerpay_charge", "ledgerpay_refund"),
            problem="LEDGERPAY_URL is not set",
            fix="set it to your ledgerpay service's URL",
        )
    """

    tools: tuple[str, ...]
    """The family's tools that cannot work without the service. A worker that serves none
    of them starts; the line it refuses with otherwise says how to leave them out."""
    problem: str
    """What is missing, naming the setting (``STRIPE_API_KEY is not set``)."""
    fix: str
    """How to provide it (``set it to your Stripe secret key``)."""


@dataclass(frozen=True, kw_only=True)
class Redaction:
    """A secret the family's settings or clients may print: ``scrub`` replaces it in every
    log line and span of the process, and the boundary refuses tool arguments holding it.

    The pattern is matched only where no ASCII letter or digit precedes it. It runs on
    every log line and request, so keep it linear: a literal prefix, then bounded or
    possessive repeats (``[A-Za-z0-9]{8,}+``), never nested quantifiers. A group named
    ``value`` narrows what is removed to that group (the whole match otherwise); name no
    other group and refer back to none (the patterns of all families run as one).

    Example::

        Redaction(what="Stripe secret key", pattern=r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9_]{8,}+")
    """

    what: str
    """What the secret is, as a refusal names it (``Stripe secret key``)."""
    pattern: str
    """A regular expression (``re`` syntax) matching the whole secret."""


@dataclass(frozen=True, kw_only=True)
class ClientRetryCheck:
    """How to see whether a client library's objects retry on their own, for the worker's
    check of every tool's client (``client_retry_problems``). onceflow knows httpx,
    requests and urllib3; a family whose client is built on another library declares it.

    Example::

        ClientRetryCheck(
            module="stripe",
            retries=stripe_client_retries,  # "max_network_retries=2", or None
            fix="build the StripeClient with max_network_retries=0",
        )
    """

    module: str
    """The library's top-level module (``stripe``). Objects of its types are checked with
    ``retries`` and never searched for clients they hold."""
    retries: Callable[[Any], str | None]
    """Given an object of the library, the retry setting it leaves on (``retries=3``), or
    None when it retries nothing or is not a client."""
    fix: str
    """How to turn the retries off, shown with the refusal."""


@dataclass(frozen=True, kw_only=True)
class ToolFamily:
    """The tools one package brings and what onceflow must know about their services.

    What an ``onceflow.tools`` entry point or an ``ONCEFLOW_TOOLS`` import path may name
    (besides a ``Tool`` or a list of them), or what a function it names returns. A function
    taking one argument gets the process's ``onceflow.settings.SettingsSource``: reading its
    sections there (``settings.read(LedgerpaySettings)``) gives the values the rest of the
    process checked. onceflow's own families are built the same way
    (``onceflow.payments.payment_family``, …).

    Example::

        def ledgerpay_family(settings: SettingsSource) -> ToolFamily:
            ledgerpay = settings.read(LedgerpaySettings)
            return ToolFamily(
                name="ledgerpay",
                tools=ledgerpay_tools(ledgerpay),
                problems=() if ledgerpay.api_key else (
                    StartupProblem(tools=("ledgerpay_charge",), problem="LEDGERPAY_API_KEY is "
                                   "not set", fix="set it to your ledgerpay API key"),
                ),
                redactions=(Redaction(what="ledgerpay API key", pattern=r"lpk_[a-z0-9]{24}"),),
            )
    """

    name: str
    """The family's name (``payments``), in messages."""
    tools: tuple[Tool, ...]
    """Its tools, in catalogue order."""
    problems: tuple[StartupProblem, ...] = ()
    """Services its tools need that this process's settings lack, each with its fix: a
    worker serving an affected tool refuses to start. Default none."""
    redactions: tuple[Redaction, ...] = ()
    """Secrets its settings or clients may print. Default none (onceflow's own rules still
    apply: card numbers, bearer and basic credentials, passwords in URLs, …)."""
    client_checks: tuple[ClientRetryCheck, ...] = ()
    """How to see the retries of client libraries onceflow does not know. Default none."""
    open_auditor: OpenAuditor | None = None
    """Its audit against the provider's own records (``onceflow audit --family <name>``,
    and the scheduled audit on workers). Default none: the family offers no audit."""

    def __post_init__(self) -> None:
        # A list is as good as a tuple to write; kept as a tuple, the family stays hashable.
        for name in ("tools", "problems", "redactions", "client_checks"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))

    def serving(self, names: Sequence[str]) -> "ToolFamily":
        """The family narrowed to the tools named in ``names`` (their problems only)."""
        wanted = set(names)
        return replace(
            self,
            tools=tuple(tool for tool in self.tools if tool.name in wanted),
            problems=tuple(
                problem for problem in self.problems if wanted.intersection(problem.tools)
            ),
        )


def family_problems(family: ToolFamily) -> list[Problem]:
    """Every mistake in ``family`` beyond its tools', each with a fix."""
    problems: list[Problem] = []
    names = {tool.name for tool in family.tools if isinstance(tool, Tool)}
    for startup in family.problems:
        strangers = [tool for tool in startup.tools if tool not in names]
        if not startup.tools or strangers:
            problems.append(
                (
                    f"its start-up problem {startup.problem!r} names "
                    f"{', '.join(strangers) or 'no tool'}, not one of its tools",
                    "name the family's tools that need the service",
                )
            )
    for redaction in family.redactions:
        try:
            compiled = re.compile(redaction.pattern)
        except re.error as error:
            problems.append(
                (
                    f"its redaction {redaction.what!r} is not a regular expression ({error})",
                    "correct the pattern (Python re syntax)",
                )
            )
            continue
        if compiled.match(""):
            problems.append(
                (
                    f"its redaction {redaction.what!r} matches empty text",
                    "make the pattern match the secret itself (a literal prefix, then its "
                    "characters)",
                )
            )
    for check in family.client_checks:
        if not callable(check.retries):
            problems.append(
                (
                    f"its client check for {check.module!r} has no callable retries",
                    "pass a function taking the client and returning its retry setting or None",
                )
            )
    return problems


_LOADED: dict[str, ToolFamily] = {}
"""The families loaded in this process, by name: their redactions and client checks hold
for the whole process."""


def remember_family(family: ToolFamily) -> None:
    """Make ``family``'s redactions and client checks hold in this process."""
    _LOADED[family.name] = family


def loaded_families() -> tuple[ToolFamily, ...]:
    """Every family loaded in this process, in the order they were first loaded."""
    return tuple(_LOADED.values())


def loaded_client_checks() -> tuple[ClientRetryCheck, ...]:
    """The client checks of every loaded family, each once."""
    return tuple(
        dict.fromkeys(check for family in _LOADED.values() for check in family.client_checks)
    )
