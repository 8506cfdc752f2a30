"""A person's answer to a call awaiting approval, as the framework adapters send it: the
approver's principal decides the step, bound to the digest of the arguments onceflow
holds for the call (never a digest the app computed)."""

from onceflow_client._client import CallResult, OnceflowClient
from onceflow_client._errors import DecisionConflict


async def decide_call(
    approver: OnceflowClient, answer: CallResult, *, approved: bool, reason: str
) -> None:
    """Approve or deny the step behind ``answer`` (awaiting approval) as ``approver``.

    A step another person decided meanwhile is not an error: the call's own answer says
    how it was decided, and that is what the model is told.

    Raises:
        DecisionConflict: The task refused the decision (``decision-refused``).
        OnceflowError: The gateway refused it (e.g. ``PermissionDenied``).
    """
    try:
        await approver.approve(
            answer.task_id,
            answer.repeat_of or answer.step_id,
            approved=approved,
            reason=reason,
            arguments_digest=str(answer.body["arguments_digest"]),
        )
    except DecisionConflict as refused:
        if refused.problem_type != "decision-conflict":
            raise
