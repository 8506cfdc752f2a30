"""The ``OnceflowTools`` service's handler, served by the onceflow worker.

An operation is the onceflow task itself: the handler checks the call as the boundary
does (the principal's tools, the tool's arguments, no card data or secrets), derives the
task's workflow id from the caller's identity (``_caller``) and starts the task through
the Nexus context, so Temporal attaches the operation's completion callback to it::

    start ──▶ no task under the id ─────────▶ started (USE_EXISTING), completes async
          ├─▶ the same request's task running ▶ joined: callback and request id attached
          ├─▶ the same request's task ended ──▶ completes at once with its final status
          └─▶ another request's task ─────────▶ refused (BAD_REQUEST): nothing attached

The task's status is the operation's result, step by step: state, resource (the
provider's ids), ``result["repeat_of"]`` when another call of the intent answered it. A
parked step or one awaiting approval keeps the task, and so the operation, open.

Cancellation follows the MCP tasks rule (an unsent call is abandoned, a sent one is not
undone): a step awaiting approval is denied on the caller's behalf; anything that may
have been sent goes on, and the operation completes when the task ends.
"""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nexusrpc import HandlerError, HandlerErrorType
from nexusrpc.handler import OperationHandler, operation_handler, service_handler
from opentelemetry import trace
from pydantic import ValidationError
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.nexus import (
    CancelWorkflowRunOptions,
    TemporalCancelOperationContext,
    TemporalNexusClient,
    TemporalOperationHandler,
    TemporalOperationResult,
    TemporalStartOperationContext,
)
from temporalio.service import RPCError, RPCStatusCode

from onceflow.errors import DecisionConflict, DecisionRefused
from onceflow.gateway import TOOL_CALL_STEP_ID, Principal, request_fingerprint
from onceflow.idempotency import REQUEST_HASH_MEMO
from onceflow.nexus._caller import nexus_caller
from onceflow.nexus._service import SERVICE_NAME, NexusPlan, NexusToolCall, OnceflowTools
from onceflow.task_api import TaskClient
from onceflow.telemetry import current_trace_id, sensitive_locations, unstorable_locations
from onceflow.tools import ToolContract
from onceflow.tools.worker import Catalogue, derive_task_workflow_id
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.task_models import (
    TRACE_ID_MEMO,
    AgentTaskInput,
    ApproveInput,
    StepInput,
    StepState,
    TaskStatus,
)

WITHDRAWN_BY_CALLER = "withdrawn by the Nexus caller (operation cancelled) before it was sent"
"""The reason recorded in the task for a step its caller cancelled while it awaited
approval: a denial, never an approval."""

PrincipalSource = Callable[[], Awaitable[Principal | None]]
"""The principal the service acts as, read for each start (its tools may change)."""

Request = TypeVar("Request", NexusToolCall, NexusPlan)


@dataclass(frozen=True)
class _Admitted:
    """A checked request: the task to start and what identifies it."""

    task: AgentTaskInput
    scope: str
    body: dict[str, Any]


@service_handler(service=OnceflowTools)
class OnceflowToolsHandler:
    """Runs each operation as an onceflow task of the principal ``principal`` names.

    Args:
        tasks: The task client on the worker's own namespace and task queue, whose
            catalogue holds the tools this worker serves (their policies go with each
            task: a task without them is refused).
        principal: Reads the principal the service acts as (``nexus_principal``); None
            (no such principal) refuses every operation.
    """

    def __init__(self, *, tasks: TaskClient, catalogue: Catalogue, principal: PrincipalSource):
        self._tasks = tasks
        self._catalogue = catalogue
        self._principal = principal

    @operation_handler
    def call_tool(self) -> OperationHandler[NexusToolCall, TaskStatus]:
        """One tool call as a one-step task."""
        return _TaskOperation(self, self._admit_call)

    @operation_handler
    def run_plan(self) -> OperationHandler[NexusPlan, TaskStatus]:
        """A plan as one task."""
        return _TaskOperation(self, self._admit_plan)

    async def principal(self) -> Principal:
        """The principal operations run as.

        Raises:
            HandlerError: UNAUTHORIZED when it does not exist.
        """
        principal = await self._principal()
        if principal is None:
            raise HandlerError(
                "the onceflow principal this Nexus service acts as does not exist",
                type=HandlerErrorType.UNAUTHORIZED,
            )
        return principal

    @property
    def tasks(self) -> TaskClient:
        """The task client operations start tasks with."""
        return self._tasks

    def _admit_call(self, principal: Principal, request: NexusToolCall) -> _Admitted:
        contract = self._allowed(principal, request.tool)
        if request.deliberate_repeat and not contract.deliberate_repeats:
            raise _bad_request(
                f"tool {request.tool!r} does not allow deliberate repeats: the same intent "
                "is answered by its first call"
            )
        arguments = _checked_arguments(contract, request.arguments, "arguments")
        step = StepInput(
            step_id=TOOL_CALL_STEP_ID,
            tool=request.tool,
            arguments=arguments,
            deliberate_repeat=request.deliberate_repeat,
        )
        return _Admitted(
            task=AgentTaskInput(tenant=principal.tenant, principal=principal.name, steps=[step]),
            scope=_scope(principal, request.tool),
            body=step.model_dump(mode="json"),
        )

    def _admit_plan(self, principal: Principal, request: NexusPlan) -> _Admitted:
        steps = [
            step.model_copy(
                update={
                    "arguments": _checked_arguments(
                        self._allowed(principal, step.tool),
                        step.arguments,
                        f"steps[{index}].arguments",
                    )
                }
            )
            for index, step in enumerate(request.steps)
        ]
        try:
            task = AgentTaskInput(tenant=principal.tenant, principal=principal.name, steps=steps)
        except ValidationError as invalid:
            raise _bad_request(_problems(invalid, "steps")) from None
        return _Admitted(
            task=task,
            scope=_scope(principal, "task"),
            body={"steps": [step.model_dump(mode="json") for step in steps]},
        )

    def _allowed(self, principal: Principal, tool: str) -> ToolContract:
        if tool not in self._catalogue:
            raise _bad_request(f"no tool {tool!r} is served here")
        if not principal.may_call(tool):
            raise HandlerError(
                f"principal {principal.name!r} may not call {tool!r}",
                type=HandlerErrorType.UNAUTHORIZED,
            )
        return self._catalogue.get(tool)


class _TaskOperation(TemporalOperationHandler[Request, TaskStatus], Generic[Request]):
    """One operation of the service: start (or join) its task; cancel cooperatively."""

    def __init__(
        self,
        service: OnceflowToolsHandler,
        admit: Callable[[Principal, Request], _Admitted],
    ) -> None:
        self._service = service
        self._admit: Callable[[Principal, Request], _Admitted] = admit

    async def start_operation(
        self,
        ctx: TemporalStartOperationContext,
        client: TemporalNexusClient,
        input: Request,
    ) -> TemporalOperationResult[TaskStatus]:
        principal = await self._service.principal()
        admitted = self._admit(principal, input)
        caller = nexus_caller(ctx.inbound_links, ctx.request_id)
        workflow_id = derive_task_workflow_id(
            tenant=principal.tenant,
            scope=admitted.scope,
            idempotency_key=caller.call_key(input.call_id),
        )
        fingerprint = request_fingerprint(
            operation=f"nexus.{ctx.operation}",
            scope=admitted.scope,
            route=f"nexus {SERVICE_NAME}/{ctx.operation}",
            body=admitted.body,
        )
        tasks = self._service.tasks
        if await self._ended(client, workflow_id, fingerprint):
            return TemporalOperationResult.sync(await tasks.ended(workflow_id))
        # As ``TaskClient.start``: a span of the caller's trace (the tracing interceptor
        # carries it over Nexus headers), its id in the memo for the Temporal UI.
        with trace.get_tracer("onceflow.tasks").start_as_current_span(
            "StartTask",
            attributes={
                "onceflow.workflow_id": workflow_id,
                "onceflow.tenant": principal.tenant,
                "onceflow.principal": principal.name,
                "onceflow.tools": admitted.task.plan_tools(),
                "onceflow.nexus_operation": ctx.operation,
            },
        ):
            memo = {REQUEST_HASH_MEMO: fingerprint}
            if (trace_id := current_trace_id()) is not None:
                memo[TRACE_ID_MEMO] = trace_id
            task, options = tasks.start_request(admitted.task, workflow_id=workflow_id, memo=memo)
            try:
                return await client.start_workflow(AgentTaskWorkflow.run, task, **options)
            except WorkflowAlreadyStartedError:
                # It ended between the look and the start (REJECT_DUPLICATE): its end.
                return TemporalOperationResult.sync(await tasks.ended(workflow_id))

    async def _ended(self, client: TemporalNexusClient, workflow_id: str, fingerprint: str) -> bool:
        """Whether the task under ``workflow_id`` exists and has ended.

        Raises:
            HandlerError: BAD_REQUEST when it is another request's (the caller reused a
                call id for other arguments): ``USE_EXISTING`` would join it blindly.
        """
        try:
            described = await client.client.get_workflow_handle(workflow_id).describe()
        except RPCError as error:
            if error.status is RPCStatusCode.NOT_FOUND:
                return False
            raise
        memo = await described.memo()
        if memo.get(REQUEST_HASH_MEMO) != fingerprint:
            raise _bad_request(
                "this call id was used for another request by the same caller: send a new "
                "call id for a new call"
            )
        return described.status is not WorkflowExecutionStatus.RUNNING

    async def cancel_workflow_run(
        self, ctx: TemporalCancelOperationContext, options: CancelWorkflowRunOptions
    ) -> None:
        """Withdraw the task's steps that await approval (nothing of theirs was sent);
        leave every other step to go on: it may have taken effect."""
        tasks = self._service.tasks
        status = await tasks.status(options.workflow_id)
        for step in status.steps:
            if step.state is not StepState.AWAITING_APPROVAL:
                continue
            denial = ApproveInput(
                step_id=step.step_id,
                approved=False,
                approver=status.principal,
                reason=WITHDRAWN_BY_CALLER,
                arguments_digest=step.arguments_digest,
            )
            try:
                await tasks.approve(options.workflow_id, denial)
            except (DecisionConflict, DecisionRefused):
                pass  # a person decided first: the step goes their way


def _scope(principal: Principal, target: str) -> str:
    """The scope of a Nexus call (``(tenant, principal, tool or task, operation)``): its
    own operation, so no HTTP key's task can be a Nexus call's."""
    return f"{principal.tenant}:{principal.name}:{target}:nexus"


def _checked_arguments(contract: ToolContract, arguments: Any, where: str) -> dict[str, Any]:
    """The arguments as the tool reads them, as JSON data; refused (saying where, never
    what) when they hold card data, a secret or text no store can keep."""
    findings = [*unstorable_locations(arguments), *sensitive_locations(arguments)]
    if findings:
        places = ", ".join(
            f"{where}{''.join(f'[{part!r}]' for part in found.location)} ({found.kind})"
            for found in findings
        )
        raise _bad_request(
            f"the arguments cannot be taken: {places}; onceflow never takes card data or "
            "credentials as tool arguments, nor text with NUL or unpaired surrogates"
        )
    try:
        normalized: dict[str, Any] = contract.input_model.model_validate(arguments).model_dump(
            mode="json"
        )
    except ValidationError as invalid:
        raise _bad_request(_problems(invalid, where)) from None
    return normalized


def _problems(invalid: ValidationError, where: str) -> str:
    """A validation error's locations and messages, never the input."""
    return "invalid request: " + "; ".join(
        f"{where}.{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
        for error in invalid.errors(include_input=False)
    )


def _bad_request(message: str) -> HandlerError:
    return HandlerError(message, type=HandlerErrorType.BAD_REQUEST)
