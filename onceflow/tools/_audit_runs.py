"""A scheduled audit's run: its models and the activity that runs a family's ``Auditor``.

``onceflow audit --schedule`` creates a Temporal Schedule that starts an ``AuditWorkflow``
(``onceflow/workflows/audit.py``) every interval; the workflow runs ``RUN_AUDIT`` once
(no retry: the next scheduled run is the retry) on a worker that has the family's
auditor, and shows what it found as its result, its current details and metrics.
"""

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict
from temporalio import activity
from temporalio.exceptions import ApplicationError

from onceflow.tools._audit import Auditor, AuditWindow

RUN_AUDIT = "onceflow_run_audit"
"""The activity (by name) that runs one family's audit over one window."""


class AuditRunInput(BaseModel):
    """What a scheduled audit reads: the window that ends when the run starts."""

    model_config = ConfigDict(frozen=True)

    family: str
    """The tool family, e.g. ``payments``."""
    window: timedelta
    """How far back each run reads; longer than the interval, so windows overlap and an
    effect made just before one run is judged by the next."""
    in_flight_grace: timedelta = timedelta(minutes=15)
    """See ``AuditWindow.in_flight_grace``. Default 15 minutes."""


class AuditActivityInput(BaseModel):
    """One audit over one window (the workflow fixes the window from its own clock)."""

    model_config = ConfigDict(frozen=True)

    family: str
    since: datetime
    until: datetime
    in_flight_grace: timedelta


class AuditRunResult(BaseModel):
    """What one audit found: ``AuditReport.to_json()`` as a model."""

    model_config = ConfigDict(frozen=True)

    family: str
    since: datetime
    until: datetime
    clean: bool
    counts: dict[str, int]
    """Findings per kind: ``duplicate``, ``orphan``, ``missing``."""
    findings: list[dict[str, Any]]
    totals: list[dict[str, Any]]
    operations_read: int
    effects_read: int
    in_flight: int


class AuditActivities:
    """The audit activity, with the auditors this worker can run, by family."""

    def __init__(self, auditors: Mapping[str, Auditor]) -> None:
        self._auditors = dict(auditors)

    @activity.defn(name=RUN_AUDIT)
    async def run_audit(self, request: AuditActivityInput) -> AuditRunResult:
        """Run the family's audit, heartbeating its progress.

        Raises:
            ApplicationError: This worker has no auditor for the family (non-retryable).
        """
        auditor = self._auditors.get(request.family)
        if auditor is None:
            raise ApplicationError(
                f"this worker cannot audit {request.family!r}: it audits "
                f"{sorted(self._auditors) or 'nothing'} (payments needs STRIPE_API_KEY)",
                type="AuditorMissing",
                non_retryable=True,
            )
        window = AuditWindow(
            since=request.since, until=request.until, in_flight_grace=request.in_flight_grace
        )
        report = await auditor.audit(
            window, progress=lambda what, done: activity.heartbeat(what, done)
        )
        return AuditRunResult.model_validate(report.to_json())
