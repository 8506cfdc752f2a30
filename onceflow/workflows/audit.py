"""``AuditWorkflow``: one scheduled audit of a tool family against its provider.

A Temporal Schedule (``onceflow audit --schedule``) starts it every interval. It audits
the window of ``window`` ending at its own start (``workflow.now()`` of its first workflow
task: history fixes it), once (no retry: the schedule's next run is the retry), then
shows what it found three ways: its result, its current details in the Temporal UI, and
the gauge ``onceflow_audit_findings`` (``family``, ``kind``) from the replay-safe
workflow meter, which an alert on ``> 0`` pages on.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from onceflow.encryption import ClearText
    from onceflow.tools.worker import RUN_AUDIT, AuditActivityInput, AuditRunInput, AuditRunResult

AUDIT_FINDINGS_GAUGE = "onceflow_audit_findings"
"""Findings of a family's last scheduled audit, by ``family`` and ``kind``."""
AUDIT_TIMEOUT = timedelta(minutes=30)
"""The longest one audit may read."""
AUDIT_HEARTBEAT = timedelta(minutes=5)
"""An audit reports progress after every page; silent this long, it is lost."""


@workflow.defn
class AuditWorkflow:
    """Audits one family over the window that ends when it starts."""

    @workflow.run
    async def run(self, request: AuditRunInput) -> AuditRunResult:
        until = workflow.now()
        result: AuditRunResult = await workflow.execute_activity(
            RUN_AUDIT,
            AuditActivityInput(
                family=request.family,
                since=until - request.window,
                until=until,
                in_flight_grace=request.in_flight_grace,
            ),
            result_type=AuditRunResult,
            start_to_close_timeout=AUDIT_TIMEOUT,
            heartbeat_timeout=AUDIT_HEARTBEAT,
            retry_policy=RetryPolicy(maximum_attempts=1),
            summary=ClearText(f"audit {request.family} against its provider"),
        )
        gauge = workflow.metric_meter().create_gauge(
            AUDIT_FINDINGS_GAUGE, "findings of the last scheduled audit"
        )
        for kind, count in result.counts.items():
            gauge.set(count, {"family": request.family, "kind": kind})
        workflow.set_current_details(describe(result))
        return result


def describe(result: AuditRunResult) -> ClearText:
    """The run's findings for the Temporal UI: ids and counts only, never a body."""
    verdict = "clean" if result.clean else "FINDINGS"
    counts = ", ".join(f"{count} {kind}" for kind, count in result.counts.items())
    lines = [
        f"**audit of {result.family}: {verdict}** ({counts})",
        f"window {result.since.isoformat(timespec='seconds')} to "
        f"{result.until.isoformat(timespec='seconds')}: {result.effects_read} provider "
        f"object(s), {result.operations_read} record(s)",
    ]
    if result.findings:
        lines += ["", "| finding | task / step | resources |", "| --- | --- | --- |"]
        for finding in result.findings[:50]:
            where = (
                f"{finding['workflow_id']} / {finding['step_id']}"
                if finding.get("workflow_id")
                else "-"
            )
            lines.append(f"| {finding['kind']} | {where} | {', '.join(finding['resource_ids'])} |")
        if len(result.findings) > 50:
            lines.append(f"and {len(result.findings) - 50} more (the result lists them all)")
    return ClearText("\n".join(lines))
