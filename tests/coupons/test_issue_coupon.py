"""``issue_coupon`` on its own against PostgreSQL: the unique constraint, not an
exists-check, makes one issuance per user and coupon."""

import uuid

import psycopg

from onceflow.coupons import coupon_tools
from onceflow.storage import build_pool
from onceflow.tools.worker import ToolCallInput, tool_activities
from tests.harness import attempt_environment


def call(arguments: dict[str, object], *, workflow_id: str = "wf-1") -> ToolCallInput:
    return ToolCallInput(
        tenant="acme",
        principal="agent",
        workflow_id=workflow_id,
        step_id="s",
        tool="issue_coupon",
        arguments=arguments,
        attempt=1,
        policy=coupon_tools()[0].registered_contract.policy(),
    )


async def test_issue_coupon_reports_an_existing_issuance_instead_of_a_second_row(
    database: str,
) -> None:
    user = f"u-{uuid.uuid4().hex[:6]}"
    arguments = {"user_id": user, "coupon_id": "VIP"}
    [issue_coupon] = coupon_tools()
    async with build_pool(database) as pool:
        [perform] = tool_activities(issue_coupon, pool, None)
        env = attempt_environment()
        mine = await env.run(perform, call(arguments))
        my_repeat = await env.run(perform, call(arguments))
        theirs = await env.run(perform, call(arguments, workflow_id="wf-2"))

    assert mine.result["already_issued"] is False
    assert my_repeat.result["already_issued"] is False  # our own earlier attempt
    assert theirs.result["already_issued"] is True
    assert mine.resource_id == my_repeat.resource_id == theirs.resource_id
    with psycopg.connect(database) as conn:
        assert conn.execute(
            "SELECT count(*) FROM coupon_issuances WHERE user_id = %s", (user,)
        ).fetchone() == (1,)
