"""Registration checks: a contract that would let a repeat do harm is refused, with a fix.

Each check returns the problems it finds as ``(what is wrong, how to fix it)``; the
catalogue joins them into one ``ToolRegistrationError`` so a tool author sees every
mistake at once, at start-up, instead of one per failed task.
"""

import re
from datetime import timedelta

from pydantic import BaseModel

from onceflow.errors import OnceflowError
from onceflow.tools._contract import DedupeStrategy, ToolContract

TOOL_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
"""Tool names are activity names, MCP tool names and URL path segments at once."""
LONGEST_ATTEMPT = timedelta(days=1)
"""An attempt limit beyond this is a missing limit in disguise: use heartbeats instead."""
RESERVED_NAMES = frozenset({"record_task_outcome", "prune_idempotency_records"})
"""onceflow's own activity names, which no tool may take."""

Problem = tuple[str, str]


class ToolRegistrationError(OnceflowError, ValueError):
    """A tool's contract or implementation is unsafe or incomplete; it is not registered."""

    code = "tool-registration"
    title = "Tool not registered"


def contract_problems(contract: ToolContract) -> list[Problem]:
    """Every mistake in ``contract``, each with its fix; empty when it may be registered."""
    return [
        *_identity_problems(contract),
        *_timeout_problems(contract),
        *_effect_problems(contract),
        *_approval_problems(contract),
    ]


def refuse(name: str, problems: list[Problem]) -> ToolRegistrationError:
    """One error listing every problem of the tool ``name``, one line each."""
    lines = "\n".join(f"  - {what}; fix: {fix}" for what, fix in problems)
    return ToolRegistrationError(f"tool {name!r} is refused:\n{lines}")


def refuse_family(name: str, problems: list[Problem]) -> ToolRegistrationError:
    """One error listing every problem of the tool family ``name``, one line each."""
    lines = "\n".join(f"  - {what}; fix: {fix}" for what, fix in problems)
    return ToolRegistrationError(f"tool family {name!r} is refused:\n{lines}")


def _identity_problems(contract: ToolContract) -> list[Problem]:
    problems: list[Problem] = []
    if not TOOL_NAME.fullmatch(contract.name):
        problems.append(
            (
                f"the name {contract.name!r} is not a lower-case identifier of at most 64 "
                "characters",
                "use letters a-z, digits and underscores, starting with a letter",
            )
        )
    if contract.name in RESERVED_NAMES:
        problems.append((f"{contract.name!r} is onceflow's own activity", "choose another name"))
    if not contract.description.strip():
        problems.append(("the description is empty", "say in one sentence what the tool does"))
    if not (isinstance(contract.input_model, type) and issubclass(contract.input_model, BaseModel)):
        problems.append(
            (
                "input_model is not a pydantic model class",
                "pass a subclass of pydantic.BaseModel describing the arguments",
            )
        )
    return problems


def _timeout_problems(contract: ToolContract) -> list[Problem]:
    timeout = contract.start_to_close_timeout
    if timeout is None:
        return [
            (
                "it has no start_to_close_timeout, so a hung attempt would never end and its "
                "outcome would stay unknown",
                "set start_to_close_timeout=timedelta(seconds=…) a little above the slowest "
                "successful call",
            )
        ]
    problems: list[Problem] = []
    if not timedelta(0) < timeout <= LONGEST_ATTEMPT:
        problems.append(
            (
                f"start_to_close_timeout {timeout} is not between 0 and {LONGEST_ATTEMPT}",
                "set a positive limit; for longer work, heartbeat with heartbeat_timeout",
            )
        )
    heartbeat = contract.heartbeat_timeout
    if heartbeat is not None and not timedelta(0) < heartbeat < timeout:
        problems.append(
            (
                f"heartbeat_timeout {heartbeat} is not shorter than start_to_close_timeout "
                f"{timeout}",
                "set a heartbeat_timeout well below the attempt limit, or none",
            )
        )
    return problems


def _effect_problems(contract: ToolContract) -> list[Problem]:
    problems: list[Problem] = []
    effects, dedupe = contract.effects, contract.dedupe
    if effects.idempotent and dedupe is DedupeStrategy.NONE:
        problems.append(
            (
                "it claims to be idempotent but names no dedupe strategy, so nothing would "
                "make a repeat harmless",
                "name the mechanism that dedupes a repeat (dedupe=DedupeStrategy.…), or set "
                "idempotent=False so an unknown outcome parks",
            )
        )
    if effects.read_only and effects.destructive:
        problems.append(
            ("it is marked both read_only and destructive", "a tool is at most one of the two")
        )
    if dedupe is DedupeStrategy.PROVIDER_IDEMPOTENCY_KEY:
        retention = contract.provider_key_retention
        if retention is None:
            problems.append(
                (
                    "it relies on the provider's idempotency key but does not say how long "
                    "the provider remembers keys",
                    "set provider_key_retention to the provider's documented key lifetime",
                )
            )
        elif contract.retention_margin >= retention:
            problems.append(
                (
                    f"retention_margin {contract.retention_margin} leaves nothing of "
                    f"provider_key_retention {retention}",
                    "use a margin well below the retention",
                )
            )
        if contract.provider_settle_time < timedelta(0):
            problems.append(
                (
                    f"provider_settle_time ({contract.provider_settle_time.total_seconds():g} s) "
                    "is negative",
                    "set how long the provider may still act on a request after it was sent",
                )
            )
    return problems


def _approval_problems(contract: ToolContract) -> list[Problem]:
    threshold = contract.approval_threshold
    if threshold is None:
        return []
    if not contract.requires_approval:
        return [
            (
                "it has an approval_threshold but requires_approval is False",
                "set requires_approval=True, or drop the threshold",
            )
        ]
    fields = getattr(contract.input_model, "model_fields", {})
    if threshold.argument not in fields:
        return [
            (
                f"the approval threshold compares {threshold.argument!r}, which is not an "
                "input field",
                f"name one of: {', '.join(sorted(fields)) or 'the input fields'}",
            )
        ]
    return []
