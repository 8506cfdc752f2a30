"""A task started from the CLI carries its trace id, and the trace reaches the collector.

``onceflow call`` runs as a real process configured only through ``OTEL_*`` variables,
like the stack's worker: its ``cli.call`` span is the root of the task's trace, the id is
in the task's memo, and the worker's workflow and attempt spans continue that trace.
"""

import asyncio
import json
import os
import uuid

from onceflow.tools.worker import key_digest
from onceflow.workflows.agent_task import TRACE_ID_MEMO
from onceflow.workflows.task_models import TaskState
from tests.harness import REPO, onceflow_command

from .conftest import TelemetryStack
from .test_trace import attempts_of, children


async def test_a_task_started_from_the_cli_has_its_trace_id_in_the_memo_and_one_trace(
    stack: TelemetryStack,
) -> None:
    tenant = f"otel-cli-{uuid.uuid4().hex[:8]}"
    key = f"cli-key-{uuid.uuid4().hex}"
    process = await asyncio.create_subprocess_exec(
        *onceflow_command(
            "call",
            "issue_coupon",
            "--tenant",
            tenant,
            "--key",
            key,
            "--args",
            json.dumps({"user_id": f"u-{uuid.uuid4().hex[:6]}", "coupon_id": "WELCOME10"}),
            "--wait",
        ),
        cwd=REPO,
        env={**os.environ, **stack.env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 0, err.decode()
    assert b"Traceback" not in err
    status = json.loads(out)
    assert status["state"] == TaskState.SUCCEEDED.value
    task_id = status["workflow_id"]

    memo = await (await stack.client.get_workflow_handle(task_id).describe()).memo()
    trace_id = memo[TRACE_ID_MEMO]
    assert len(trace_id) == 32 and int(trace_id, 16) != 0

    # The CLI flushed its spans before it exited; the worker's follow on its schedule.
    spans = await stack.otlp.wait_for_spans(
        lambda spans: bool(attempts_of(spans, task_id, "issue_coupon"))
    )
    in_trace = [s for s in spans if s.trace_id == trace_id]
    [root] = [s for s in in_trace if not s.parent_span_id]
    assert (root.name, root.service) == ("cli.call issue_coupon", "onceflow-cli")
    assert root.attributes["onceflow.workflow_id"] == task_id
    assert root.attributes["onceflow.tenant"] == tenant
    assert root.attributes["onceflow.key_digest"] == key_digest(key)
    [start] = [s for s in children(in_trace, root) if s.name == "StartTask"]
    assert [s.name for s in children(in_trace, start)] == ["StartWorkflow:AgentTaskWorkflow"]
    assert {s.service for s in in_trace} == {"onceflow-cli", "onceflow-worker"}
    assert any(s.name == "RunWorkflow:AgentTaskWorkflow" for s in in_trace)
    [attempt] = attempts_of(spans, task_id, "issue_coupon")
    assert attempt.trace_id == trace_id
    assert attempt.attributes["onceflow.outcome"] == "succeeded"
    for export in stack.otlp.raw_exports():
        assert key.encode() not in export
