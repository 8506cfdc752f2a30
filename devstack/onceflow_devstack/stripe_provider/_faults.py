"""Fault injection: which failure the next matching requests suffer.

A test adds :class:`FaultRule` values (over ``POST /_test/faults`` or
:meth:`FaultPlan.add`); each API request takes the first rule that matches its method
and path and still has uses left. Where a fault strikes relative to the commit is what
makes it interesting for onceflow:

    before anything   reset_before_commit (TCP reset, nothing parsed, nothing stored)
    at the edge       rate_limit_429, error_503 (answered, key not stored)
    before executing  error_500_before_executing (500, key released: a retry with the
                      same key executes afresh and is no replay)
    before commit     error_500_before_commit (execution began: 500 stored under the key),
                      delay_before_commit (key in flight while sleeping, then commits)
    after commit      error_500_after_commit (effect done, 500 stored under the key),
                      drop_after_commit (effect and key stored, connection closed),
                      delay_after_commit (effect and key stored, answer after a sleep)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ._wire import JsonObject


class Fault(enum.StrEnum):
    """The failures the provider can inject."""

    RESET_BEFORE_COMMIT = "reset_before_commit"
    RATE_LIMIT_429 = "rate_limit_429"
    ERROR_503 = "error_503"
    ERROR_500_BEFORE_EXECUTING = "error_500_before_executing"
    ERROR_500_BEFORE_COMMIT = "error_500_before_commit"
    DELAY_BEFORE_COMMIT = "delay_before_commit"
    ERROR_500_AFTER_COMMIT = "error_500_after_commit"
    DROP_AFTER_COMMIT = "drop_after_commit"
    DELAY_AFTER_COMMIT = "delay_after_commit"


@dataclass
class FaultRule:
    """One injected failure and the requests it applies to.

    Attributes:
        fault: What happens to a matching request.
        method: HTTP method to match; None matches any. Default ``None``.
        path_prefix: Request paths starting with this match. Default ``"/v1/"``.
        times: How many matching requests suffer it; None means forever. Default ``1``.
        delay_seconds: Sleep for the delay faults. Default ``0.0``.
    """

    fault: Fault
    method: str | None = None
    path_prefix: str = "/v1/"
    times: int | None = 1
    delay_seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        """Return whether a request is subject to this rule."""
        return (self.method is None or self.method.upper() == method) and path.startswith(
            self.path_prefix
        )

    def to_json(self) -> JsonObject:
        """Return the rule in the control API's JSON shape."""
        return {
            "fault": self.fault.value,
            "method": self.method,
            "path_prefix": self.path_prefix,
            "times": self.times,
            "delay_seconds": self.delay_seconds,
        }

    @classmethod
    def from_json(cls, data: JsonObject) -> FaultRule:
        """Parse and validate the control API's JSON shape.

        Raises:
            ValueError: Unknown fault, unknown field or a value of the wrong type.
        """
        unknown = set(data) - {"fault", "method", "path_prefix", "times", "delay_seconds"}
        if unknown:
            raise ValueError(f"unknown fault rule fields: {sorted(unknown)}")
        method, prefix = data.get("method"), data.get("path_prefix", "/v1/")
        times, delay = data.get("times", 1), data.get("delay_seconds", 0.0)
        if method is not None and not isinstance(method, str):
            raise ValueError("method must be a string or null")
        if not isinstance(prefix, str):
            raise ValueError("path_prefix must be a string")
        if times is not None and (not isinstance(times, int) or times < 1):
            raise ValueError("times must be a positive integer or null")
        if not isinstance(delay, (int, float)) or delay < 0:
            raise ValueError("delay_seconds must be a non-negative number")
        return cls(Fault(str(data.get("fault"))), method, prefix, times, float(delay))


class FaultPlan:
    """The ordered rules in force; the first matching rule with uses left applies."""

    def __init__(self) -> None:
        """Start with no faults."""
        self._rules: list[FaultRule] = []

    def add(self, rule: FaultRule) -> None:
        """Append a rule after the existing ones."""
        self._rules.append(rule)

    def clear(self) -> None:
        """Remove every rule."""
        self._rules.clear()

    def rules(self) -> list[FaultRule]:
        """Return the rules in force."""
        return list(self._rules)

    def take(self, method: str, path: str) -> FaultRule | None:
        """Consume one use of the first rule matching a request.

        Args:
            method: The request's HTTP method.
            path: The request's path.

        Returns:
            The rule to apply, or None when no rule matches.
        """
        for rule in self._rules:
            if rule.matches(method, path):
                if rule.times is not None:
                    rule.times -= 1
                    if rule.times == 0:
                        self._rules.remove(rule)
                return rule
        return None
