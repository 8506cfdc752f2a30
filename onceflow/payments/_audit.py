"""The payments' audit as a pure comparison: the provider's effects in a window against
onceflow's ``operations`` records, into findings and totals (no I/O: ``_audit_io`` reads).

Effects and records meet on the operation id: the child key's digest, which every
PaymentIntent and refund onceflow makes carries as ``onceflow_operation`` metadata (with
``onceflow_tenant``, ``onceflow_workflow_id`` and ``onceflow_step``). A step's records of
every key generation are one operation::

    effect (money moved) carrying an operation id
      ├─ no record has that id ─────────────────────────────────▶ orphan (no step owns it)
      ├─ the step never succeeded
      │    ├─ still started, changed within the grace ─────────▶ in flight, not judged
      │    └─ otherwise (abandoned, failed, started long ago) ──▶ orphan
      └─ the step succeeded: its recorded resources + its listed effects > 1 ─▶ duplicate
    record 'succeeded' in the window whose resource the provider lacks
      (not listed, and a retrieve by id finds nothing or no money moved) ─────▶ missing

Only effects that moved money count (a declined PaymentIntent is no charge); objects
without an operation id are not onceflow's and are left alone.
"""

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from onceflow.payments._outcomes import CHARGE_CHILD_OP, CHARGED, REFUND_CHILD_OP, REFUNDED
from onceflow.payments._provider import OPERATION_METADATA_KEY, PaymentIntentView, RefundView
from onceflow.tools import (
    AuditFinding,
    AuditReport,
    AuditWindow,
    EffectTotal,
    FindingKind,
    OperationRecord,
)

FAMILY = "payments"
"""The tool family this audit belongs to."""
AUDITED_TOOLS = ("charge_payment", "refund_payment")
"""The tools whose records the payments' audit reads by default."""
_TOOL_OF = {CHARGE_CHILD_OP: "charge_payment", REFUND_CHILD_OP: "refund_payment"}
_MOVED_MONEY = {CHARGE_CHILD_OP: CHARGED, REFUND_CHILD_OP: REFUNDED}
_NOUN = {CHARGE_CHILD_OP: "PaymentIntent", REFUND_CHILD_OP: "refund"}


@dataclass(frozen=True, kw_only=True)
class ProviderEffect:
    """One PaymentIntent (``kind`` ``charge``) or refund (``refund``) at the provider."""

    kind: str
    """The child operation that makes it: ``charge`` or ``refund``."""
    id: str
    status: str
    amount: int
    currency: str
    metadata: Mapping[str, str]

    @classmethod
    def of_intent(cls, intent: PaymentIntentView) -> "ProviderEffect":
        """A PaymentIntent as an effect of a charge."""
        return cls(
            kind=CHARGE_CHILD_OP,
            id=intent.id,
            status=intent.status,
            amount=intent.amount,
            currency=intent.currency.lower(),
            metadata=dict(intent.metadata),
        )

    @classmethod
    def of_refund(cls, refund: RefundView) -> "ProviderEffect":
        """A refund as an effect of a refund."""
        return cls(
            kind=REFUND_CHILD_OP,
            id=refund.id,
            status=refund.status,
            amount=refund.amount,
            currency=refund.currency.lower(),
            metadata=dict(refund.metadata),
        )

    @property
    def operation_id(self) -> str | None:
        """The onceflow operation it names, None when it is not onceflow's."""
        return self.metadata.get(OPERATION_METADATA_KEY) or None

    @property
    def moved_money(self) -> bool:
        """The charge or refund exists (money moved or is moving)."""
        return self.status in _MOVED_MONEY[self.kind]

    @property
    def named_step(self) -> tuple[str, str, str] | None:
        """``(tenant, workflow_id, step_id)`` from its metadata, when it names all three."""
        named = tuple(
            self.metadata.get(name, "")
            for name in ("onceflow_tenant", "onceflow_workflow_id", "onceflow_step")
        )
        return (named[0], named[1], named[2]) if all(named) else None


@dataclass(frozen=True, kw_only=True)
class PaymentsAuditInput:
    """Everything the comparison reads, gathered by ``_audit_io``."""

    window: AuditWindow
    audited_at: datetime
    """When the audit read (for ``in_flight_grace``)."""
    effects: Sequence[ProviderEffect]
    """PaymentIntents and refunds the provider lists as created in the window."""
    operations: Sequence[OperationRecord]
    """Records of the audited tools created in the window."""
    step_operations: Sequence[OperationRecord] = ()
    """Records (of any time) of the steps that listed effects name but no record in the
    window has their operation id: an effect may come long after its step began."""
    retrieved: Mapping[str, ProviderEffect | None] | None = None
    """Resources of ``succeeded`` records in the window that the list did not show, as a
    read by id found them (None: the provider does not have it)."""


def unlisted_resources(
    effects: Iterable[ProviderEffect], operations: Iterable[OperationRecord]
) -> list[tuple[str, str]]:
    """``(kind, id)`` of the resources succeeded records name that the list did not show:
    each must be read by id before a ``missing`` is reported (it may have been created
    just outside the window)."""
    listed = {effect.id for effect in effects}
    return sorted(
        {
            (record.child_op, record.resource_id)
            for record in operations
            if record.state == "succeeded"
            and record.child_op in _TOOL_OF
            and record.resource_id
            and record.resource_id not in listed
        }
    )


def unowned_steps(
    effects: Iterable[ProviderEffect], operations: Iterable[OperationRecord]
) -> set[tuple[str, str, str]]:
    """The steps named by effects whose operation id no record in ``operations`` has:
    their records must be read whatever their age before an orphan is reported."""
    known = {record.operation_id for record in operations}
    return {
        step
        for effect in effects
        if effect.operation_id and effect.operation_id not in known
        for step in [effect.named_step]
        if step is not None
    }


def compare_payments(audit: PaymentsAuditInput) -> AuditReport:
    """The findings and totals of one window."""
    records = {r.operation_id: r for r in (*audit.operations, *audit.step_operations)}
    by_step: dict[tuple[str, str, str, str], list[OperationRecord]] = defaultdict(list)
    for record in records.values():
        by_step[record.step].append(record)
    onceflows = [e for e in audit.effects if e.operation_id and e.moved_money]
    owned: dict[tuple[str, str, str, str], list[ProviderEffect]] = defaultdict(list)
    unowned: dict[str, list[ProviderEffect]] = defaultdict(list)
    for effect in onceflows:
        owner = records.get(effect.operation_id or "")
        if owner is None or owner.child_op != effect.kind:
            unowned[effect.operation_id or ""].append(effect)
        else:
            owned[owner.step].append(effect)
    findings = [_no_step_owns(operation_id, effects) for operation_id, effects in unowned.items()]
    in_flight = 0
    for step, effects in owned.items():
        finding = _judge_step(audit, by_step[step], effects)
        if finding is None and not any(r.state == "succeeded" for r in by_step[step]):
            in_flight += len(effects)
        elif finding is not None:
            findings.append(finding)
    findings += _missing(audit)
    return AuditReport(
        family=FAMILY,
        window=audit.window,
        findings=tuple(sorted(findings, key=_finding_order)),
        totals=_totals(onceflows),
        operations_read=len(audit.operations),
        effects_read=len(audit.effects),
        in_flight=in_flight,
    )


def _no_step_owns(operation_id: str, effects: list[ProviderEffect]) -> AuditFinding:
    first = effects[0]
    named = first.named_step
    return AuditFinding(
        kind=FindingKind.ORPHAN,
        tool=_TOOL_OF[first.kind],
        detail=(
            f"{_describe(effects)} {'carry' if len(effects) > 1 else 'carries'} operation "
            f"id {operation_id}, which no step's record has"
        ),
        resource_ids=tuple(effect.id for effect in effects),
        operation_id=operation_id,
        tenant=named[0] if named else None,
        workflow_id=named[1] if named else None,
        step_id=named[2] if named else None,
    )


def _judge_step(
    audit: PaymentsAuditInput, records: list[OperationRecord], effects: list[ProviderEffect]
) -> AuditFinding | None:
    """A step's finding, if its effects disagree with its records; None when they agree or
    the step may still be recording its success."""
    succeeded = [r for r in records if r.state == "succeeded"]
    latest = max(records, key=lambda record: (record.generation, record.updated_at))
    where = _Where(
        tool=latest.tool,
        operation_id=effects[0].operation_id,
        tenant=latest.tenant,
        workflow_id=latest.workflow_id,
        step_id=latest.step_id,
    )
    if not succeeded:
        waited = audit.audited_at - latest.updated_at
        if latest.state == "started" and waited < audit.window.in_flight_grace:
            return None
        return AuditFinding(
            kind=FindingKind.ORPHAN,
            detail=(
                f"{_describe(effects)} {'exist' if len(effects) > 1 else 'exists'} for step "
                f"{latest.step_id} of {latest.workflow_id}, which is {latest.state} (it "
                "never recorded success)"
            ),
            resource_ids=tuple(effect.id for effect in effects),
            step_state=latest.state,
            **where,
        )
    recorded = list(dict.fromkeys(r.resource_id for r in succeeded if r.resource_id))
    every = recorded + [effect.id for effect in effects if effect.id not in recorded]
    if len(every) <= 1:
        return None
    extra = len(every) - len(recorded)
    return AuditFinding(
        kind=FindingKind.DUPLICATE,
        detail=(
            f"step {latest.step_id} of {latest.workflow_id} has {len(every)} "
            f"{_NOUN[latest.child_op]}s that moved money: recorded "
            f"{', '.join(recorded) or 'none'}, {extra} more at the provider"
        ),
        resource_ids=tuple(every),
        step_state="succeeded",
        **where,
    )


class _Where(TypedDict):
    """Which step a finding is about."""

    tool: str
    operation_id: str | None
    tenant: str
    workflow_id: str
    step_id: str


def _missing(audit: PaymentsAuditInput) -> list[AuditFinding]:
    listed = {effect.id: effect for effect in audit.effects}
    retrieved = audit.retrieved or {}
    findings = []
    for record in audit.operations:
        resource = record.resource_id
        if record.state != "succeeded" or record.child_op not in _TOOL_OF or not resource:
            continue
        if resource in listed:
            effect: ProviderEffect | None = listed[resource]
        elif resource in retrieved:
            effect = retrieved[resource]
        else:
            raise ValueError(f"{resource} was neither listed nor read by id")
        if effect is not None and effect.moved_money:
            continue
        noun = _NOUN[record.child_op]
        detail = (
            f"the provider has no {noun} {resource}"
            if effect is None
            else f"{noun} {resource} is {effect.status}: no money moved"
        )
        findings.append(
            AuditFinding(
                kind=FindingKind.MISSING,
                tool=record.tool,
                detail=f"step {record.step_id} of {record.workflow_id} succeeded, but {detail}",
                resource_ids=(resource,),
                operation_id=record.operation_id,
                tenant=record.tenant,
                workflow_id=record.workflow_id,
                step_id=record.step_id,
                step_state=record.state,
            )
        )
    return findings


def _totals(effects: Iterable[ProviderEffect]) -> tuple[EffectTotal, ...]:
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for effect in effects:
        count, amount = sums.get((effect.kind, effect.currency), (0, 0))
        sums[effect.kind, effect.currency] = (count + 1, amount + effect.amount)
    return tuple(
        EffectTotal(kind=kind, currency=currency, count=count, amount=amount)
        for (kind, currency), (count, amount) in sorted(sums.items())
    )


def _describe(effects: list[ProviderEffect]) -> str:
    noun = _NOUN[effects[0].kind]
    money = ", ".join(f"{e.id} ({e.amount} {e.currency}, {e.status})" for e in effects)
    return f"{len(effects)} {noun}{'s' if len(effects) > 1 else ''} {money}"


def _finding_order(finding: AuditFinding) -> tuple[str, str, str, str]:
    return (
        finding.kind.value,
        finding.workflow_id or "",
        finding.step_id or "",
        ",".join(finding.resource_ids),
    )
