"""What the boundary reads and answers, whatever the transport: request bodies, their
checks (access, keys, arguments) and the answers, with the span attributes they carry."""

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from onceflow.errors import (
    DecisionsNotAllowed,
    InvalidRequest,
    MissingIdempotencyKey,
    ToolNotAllowed,
    UnknownToolRequested,
    describe_validation,
    validation_problems,
)
from onceflow.gateway._principals import Principal
from onceflow.gateway._responses import (
    CREATED_STATUS_CODE,
    IN_PROGRESS_STATUS_CODE,
)
from onceflow.gateway._settings import GatewaySettings
from onceflow.gateway._strict import validate_strictly
from onceflow.idempotency import IdempotencyRecord, task_status_url
from onceflow.retry_policy import RetryBudget
from onceflow.task_api import DecisionAnswer
from onceflow.telemetry import sensitive_locations, unstorable_locations
from onceflow.tools import ToolContract
from onceflow.tools.worker import Catalogue, UnknownTool, check_idempotency_key, key_digest
from onceflow.workflows.task_models import NAME_PATTERN, ReconcileDecision

_LONGEST_OPEN_TASK = timedelta(days=365)


class TaskStepRequest(BaseModel):
    """One step of a task request: a tool and its arguments."""

    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(pattern=NAME_PATTERN)
    """Stable id of the step within the task (its position or the agent's call id)."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The tool's arguments, validated against the tool's input model."""


class CreateTaskRequest(BaseModel):
    """Body of ``POST /v1/tasks``: tool calls run in order under one retry budget."""

    model_config = ConfigDict(extra="forbid")

    steps: list[TaskStepRequest] = Field(min_length=1, max_length=50)
    budget: RetryBudget | None = None
    """The task's retry budget; omitted takes the defaults. Its longest retry window must
    be shorter than the gateway's result retention."""


class OpenTaskRequest(BaseModel):
    """How an open task lives: ``open`` in the body of ``POST /v1/tasks``."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    idle_timeout: timedelta = Field(
        default=timedelta(minutes=30), gt=timedelta(0), le=_LONGEST_OPEN_TASK
    )
    """The task closes after this long without a call while none is unfinished (ISO 8601
    duration such as ``PT30M``, or seconds). Default 30 minutes."""
    max_lifetime: timedelta = Field(
        default=timedelta(days=1), gt=timedelta(0), le=_LONGEST_OPEN_TASK
    )
    """No call is accepted after this long; the task closes once its calls end (ISO 8601
    duration such as ``P1D``, or seconds). Default 1 day."""


class CreateOpenTaskRequest(BaseModel):
    """Body of ``POST /v1/tasks`` for an open task: no steps; the agent sends its calls one
    by one (``POST /v1/tasks/{id}/calls``) under the task's one retry budget, then closes
    it (``POST /v1/tasks/{id}/close``). Its calls may use the tools the creating principal
    is allowed now."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    open: OpenTaskRequest
    """The open task's timeouts; ``{}`` takes the defaults."""
    budget: RetryBudget | None = None
    """The task's one retry budget for all its calls; omitted takes the defaults. Its
    longest retry window must be shorter than the gateway's result retention. In an open
    task only retries spend ``max_attempts_per_task``; its ``deadline`` counts the task's
    machine time from its creation."""


class CallRequest(BaseModel):
    """Body of ``POST /v1/tasks/{id}/calls``: one tool call of an open task."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    call_id: str | None = Field(default=None, pattern=NAME_PATTERN)
    """The call's step id in the task (e.g. the model's tool-call id). Omitted: derived
    from the Idempotency-Key, so a resend of the same request is the same call."""
    tool: str = Field(pattern=NAME_PATTERN)
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The tool's arguments, validated against the tool's input model."""
    deliberate_repeat: bool = False
    """Run even when an earlier call of this task had the same tool and arguments (a
    second identical effect, on purpose; recorded in the task). Default false: such a
    call is answered by the earlier one (``repeat_of``) and never runs."""


class ApproveRequest(BaseModel):
    """Body of ``POST /v1/tasks/{id}/approve``; the approver is the calling principal."""

    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(pattern=NAME_PATTERN)
    approved: bool
    reason: str = Field(min_length=1, max_length=2000)
    arguments_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    """The ``arguments_digest`` of the step as read from ``GET /v1/tasks/{id}``."""


class ReconcileRequest(BaseModel):
    """Body of ``POST /v1/tasks/{id}/reconcile``; the operator is the calling principal."""

    model_config = ConfigDict(extra="forbid")

    step_id: str = Field(pattern=NAME_PATTERN)
    decision: ReconcileDecision
    reason: str = Field(min_length=1, max_length=2000)
    resource_id: str | None = Field(default=None, min_length=1, max_length=255)
    unverified: bool = False
    """With ``happened``: accept ``resource_id`` although the tool's look-up cannot
    confirm it; with ``did_not_happen``: although its miss does not prove the effect
    absent (recorded as unverified). Default False."""


@dataclass(frozen=True)
class BoundaryAnswer:
    """The boundary's answer to a task or tool-call request."""

    status_code: int
    """200 for an ended task or call (stored and replayable), 202 while it is still going,
    201 for an open task that was created (or is still open, on a replay)."""
    body: dict[str, Any] = field(repr=False)
    """A ``TaskView`` (a task) or a ``CallView`` (a call of an open task) as JSON data."""
    task_id: str
    replayed: bool
    """Whether this request was answered from an earlier request's execution."""

    @property
    def in_progress(self) -> bool:
        """Whether the task (or the call) had not ended when the bounded wait was over."""
        return self.status_code == IN_PROGRESS_STATUS_CODE

    @property
    def created(self) -> bool:
        """Whether this answers the creation of an open task that is still open."""
        return self.status_code == CREATED_STATUS_CODE

    @property
    def status_url(self) -> str:
        """Where to poll the task."""
        return task_status_url(self.task_id)


@dataclass(frozen=True)
class DecisionReply:
    """The boundary's answer to an approve or reconcile request the task accepted.

    A refusal is raised instead (``DecisionRefused``, ``DecisionConflict``), flagged
    ``replayed`` when it is the stored refusal of an earlier request with the same key.
    """

    body: dict[str, Any] = field(repr=False)
    """A ``DecisionAnswer`` as JSON data: the task's answer, or with a key the stored
    answer of the key's first request, byte for byte."""
    replayed: bool
    """Whether nothing new was decided for this request: the step already had this
    decision (the body's ``replayed``), or the key's stored answer was replayed."""

    @property
    def answer(self) -> DecisionAnswer:
        """The body as a ``DecisionAnswer``."""
        return DecisionAnswer.model_validate(self.body)


def allowed_tool(catalogue: Catalogue, principal: Principal, tool: str) -> ToolContract:
    """The tool's contract; ``UnknownToolRequested`` or ``ToolNotAllowed`` otherwise."""
    try:
        contract = catalogue.get(tool)
    except UnknownTool:
        raise UnknownToolRequested("no tool of that name exists") from None
    if not principal.may_call(tool):
        raise ToolNotAllowed(f"principal {principal.name!r} may not call {tool!r}")
    return contract


def check_approver(principal: Principal) -> None:
    """Raise ``DecisionsNotAllowed`` unless the principal may approve or deny steps."""
    if not principal.approves:
        raise DecisionsNotAllowed(
            f"principal {principal.name!r} may not approve or deny steps (an approver is "
            "added with `onceflow principal add --approvals`, an operator with --decisions)"
        )


def check_reconciler(principal: Principal) -> None:
    """Raise ``DecisionsNotAllowed`` unless the principal may reconcile parked steps."""
    if principal.may_decide:
        return
    if principal.may_approve:
        raise DecisionsNotAllowed(
            f"principal {principal.name!r} may approve or deny steps but not reconcile "
            "parked ones: whether a parked effect happened is an operator's decision "
            "(`onceflow principal add --decisions`)"
        )
    raise DecisionsNotAllowed(f"principal {principal.name!r} may not approve or reconcile tasks")


def check_budget(budget: RetryBudget | None, settings: GatewaySettings) -> None:
    """Refuse a budget whose retry window outlives the records that dedupe its retries."""
    if budget is None:
        return
    window = budget.longest_retry_window
    if window >= settings.result_retention:
        raise InvalidRequest(
            f"the budget's retry window ({window.total_seconds():g} s) must be shorter "
            f"than the result retention ({settings.result_retention_seconds:g} s)",
            errors=[{"loc": ["budget"], "msg": "retry window outlives result retention"}],
        )


def request_scope(principal: Principal, target: str, operation: str) -> str:
    """The boundary that makes key reuse safe: tenant, principal, tool or task, operation."""
    return f"{principal.tenant}:{principal.name}:{target}:{operation}"


def checked_key(raw: str | None) -> str:
    """The well-formed key of a request that has an effect."""
    if raw is None or raw == "":
        raise MissingIdempotencyKey(
            "this call has an effect: send an Idempotency-Key that identifies this logical "
            "attempt, and the same key on every retry of it"
        )
    return check_idempotency_key(raw)


def checked_optional_key(raw: str | None) -> str | None:
    """A decision may carry a key; one that is sent must be well formed."""
    return checked_key(raw) if raw else None


def validated_arguments(
    model: type[BaseModel], arguments: Any, *, location: tuple[str | int, ...]
) -> dict[str, Any]:
    """The arguments as ``model`` reads them, as JSON data; ``InvalidRequest`` naming
    where (never what) when they are unstorable, sensitive or invalid."""
    # NUL and lone surrogates pass JSON parsing and validation, then fail in PostgreSQL
    # (text cannot hold NUL) or in a UTF-8 encoder (the history, the reply): refused here,
    # before anything is reserved.
    unstorable = unstorable_locations(arguments)
    if unstorable:
        named = {
            found.kind: ("an " if found.kind[0] in "aeiou" else "a ") + found.kind
            for found in unstorable
        }
        raise InvalidRequest(
            f"the arguments hold {' and '.join(sorted(named.values()))}; text in arguments "
            "must be valid Unicode without NUL (U+0000) or unpaired surrogates (U+D800 to "
            "U+DFFF)",
            errors=[
                {
                    "loc": [*location, *found.location],
                    "msg": f"{'key ' if found.in_key else ''}holds {named[found.kind]}",
                }
                for found in unstorable
            ],
        )
    # Arguments become the task's history, shown in the Temporal UI and kept for its
    # retention: a card number or an API key there would be stored and shown in clear.
    # Scanned as sent, so ignored fields count too, and before validation, whose errors
    # would name a key that holds a card number.
    sensitive = sensitive_locations(arguments)
    if sensitive:
        kinds = " and ".join(sorted({found.kind for found in sensitive}))
        raise InvalidRequest(
            f"the arguments hold a {kinds}; onceflow never takes card data or credentials "
            "as tool arguments (pass a saved payment method, pm_…, for a card)",
            errors=[
                {
                    "loc": [*location, *found.location],
                    "msg": f"{'key ' if found.in_key else ''}looks like a {found.kind}"
                    + (f" ({found.detail})" if found.detail else ""),
                }
                for found in sensitive
            ],
        )
    try:
        normalized: dict[str, Any] = validate_strictly(model, arguments).model_dump(mode="json")
    except ValidationError as invalid:
        raise invalid_request(invalid, location=location) from None
    return normalized


def parsed(model: type[BaseModel], body: Any) -> Any:
    """The body as ``model``, strictly; ``InvalidRequest`` otherwise."""
    try:
        return validate_strictly(model, body)
    except ValidationError as invalid:
        raise invalid_request(invalid, location=()) from None


def invalid_request(invalid: ValidationError, *, location: tuple[str | int, ...]) -> InvalidRequest:
    problems = validation_problems(invalid, location=location)
    summary = describe_validation(problems, whole="body", limit=5)
    return InvalidRequest(f"invalid request: {summary}", errors=problems)


def request_attributes(
    principal: Principal, scope: str, idempotency_key: str | None
) -> dict[str, AttributeValue]:
    """The gateway span's identity attributes; the key only as its digest."""
    attributes: dict[str, AttributeValue] = {
        "onceflow.tenant": principal.tenant,
        "onceflow.principal": principal.name,
        "onceflow.scope": scope,
    }
    if idempotency_key:
        attributes["onceflow.key_digest"] = key_digest(idempotency_key)
    return attributes


def decision_attributes(
    principal: Principal, task_id: str, operation: str, idempotency_key: str | None
) -> dict[str, AttributeValue]:
    """A decision span's identity attributes; the key only as its digest."""
    attributes: dict[str, AttributeValue] = {
        "onceflow.tenant": principal.tenant,
        "onceflow.principal": principal.name,
        "onceflow.workflow_id": task_id[:1000],
    }
    if idempotency_key:
        attributes["onceflow.scope"] = request_scope(principal, "task", operation)
        attributes["onceflow.key_digest"] = key_digest(idempotency_key)
    return attributes


def annotated(answer: BoundaryAnswer) -> BoundaryAnswer:
    """Record on the request's span which task answered it and how."""
    trace.get_current_span().set_attributes(
        {
            "onceflow.workflow_id": answer.task_id,
            "onceflow.replayed": answer.replayed,
            "http.response.status_code": answer.status_code,
        }
    )
    return answer


def replayed_answer(
    record: IdempotencyRecord, *, replayed: bool = True, task_id: str | None = None
) -> BoundaryAnswer:
    """The record's stored answer; ``task_id``: the task a call's record answers for (its
    own ``workflow_id`` only names the record, no task runs under it)."""
    assert record.status_code is not None
    return BoundaryAnswer(
        status_code=record.status_code,
        body=record.response_body,
        task_id=task_id or record.workflow_id,
        replayed=replayed,
    )
