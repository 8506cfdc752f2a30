"""`OnceflowPlugin`: what every client, worker and replayer of onceflow's tasks agrees on."""

from collections.abc import Callable, Sequence
from typing import Any

from temporalio.client import ClientConfig
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.converter import DataConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import ReplayerConfig, WorkerConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from onceflow.encryption import PayloadEncryptionSettings, onceflow_data_converter
from onceflow.plugin._payload_contexts import ContextFreeRunner, converter_uses_context
from onceflow.plugin._undelivered_events import DeliveredEventsRunner
from onceflow.telemetry import AttemptAnnotations, tracing_interceptor
from onceflow.workflows import AgentTaskWorkflow
from onceflow.workflows.audit import AuditWorkflow
from onceflow.workflows.pruning import PruneIdempotencyRecordsWorkflow

TASK_WORKFLOWS: tuple[type, ...] = (
    AgentTaskWorkflow,
    PruneIdempotencyRecordsWorkflow,
    AuditWorkflow,
)
"""The workflows a onceflow worker runs."""

PASS_THROUGH_SANDBOX = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("onceflow")
)
"""The sandbox with onceflow's own modules passed through, not imported again for every
workflow. Re-importing ``onceflow/workflows/agent_task.py`` for each task was about 85% of
the Python memory a waiting task held in a worker (170 of 200 KiB, tracemalloc) and the
largest share of a new task's CPU; replaying a task costs 2.5 times the CPU in the strict
sandbox (BENCHMARKS.md, "The workflow sandbox"). Its determinism is proven where the strict
sandbox (``STRICT_SANDBOX``) still runs it: the workflow tests' workers, the saved-history
replays and the replay of every history a test or chaos run made, which fail on a refused
call."""

STRICT_SANDBOX = SandboxedWorkflowRunner()
"""Temporal's default sandbox: imports the workflow's modules again for every workflow and
refuses a clock read, randomness or I/O in them."""


def workflow_runner(converter: DataConverter, *, strict_sandbox: bool = False) -> WorkflowRunner:
    """The runner of a worker or replayer whose data converter is ``converter``.

    The sandbox (``PASS_THROUGH_SANDBOX``, or ``STRICT_SANDBOX`` when ``strict_sandbox``),
    wrapped so that no task keeps state built from events its workflow tasks never
    delivered (``DeliveredEventsRunner``) and, when ``converter`` uses no serialization or
    storage context (onceflow's, encrypting or not), so that the SDK's context questions
    about each payload are answered without entering the sandbox (``ContextFreeRunner``).
    """
    runner: WorkflowRunner = DeliveredEventsRunner(
        STRICT_SANDBOX if strict_sandbox else PASS_THROUGH_SANDBOX
    )
    return runner if converter_uses_context(converter) else ContextFreeRunner(runner)


class OnceflowPlugin(SimplePlugin):
    """What a client, a worker and a ``Replayer`` must agree on, in one object, so that a
    replay test cannot drift from production.

    - Client (``connect_temporal``): onceflow's data converter and Temporal's tracing
      interceptor.
    - Worker (``build_worker``): the workflows, the activities, the workflow runner
      (``workflow_runner`` for the client's converter) and ``AttemptAnnotations``; the
      converter and the tracing interceptor come with the worker's client, as the SDK
      gives a worker its client's. A plugin configures only a worker it is given to, never
      one built on a client that carries it: ``build_worker`` gives each worker its own,
      with the activities it serves, so a worker on any client (a test's too) is the same.
    - Replayer: the data converter, the workflows, the runner and both interceptors, as
      a worker on a ``connect_temporal`` client has them.

    Args:
        encryption: Where the payload keys are, for the data converter
            (``onceflow_data_converter``). Default: none, payloads in the clear.
        activities: The activities a worker serves. Default: none.
        workflows: The workflows a worker or replayer runs. Default ``TASK_WORKFLOWS``.
            A replayer names the one whose histories it replays (an earlier release's
            class for that release's): each replay prepares every workflow it has, and in
            the strict sandbox that imports the workflow's modules again.
        tracing: The tracing interceptor. Default: ``tracing_interceptor()``.
        strict_sandbox: Run workflows in ``STRICT_SANDBOX`` instead of
            ``PASS_THROUGH_SANDBOX``: the tests' replayers do, to catch a clock read or
            I/O the pass-through sandbox lets through. Default False.
    """

    def __init__(
        self,
        *,
        encryption: PayloadEncryptionSettings | None = None,
        activities: Sequence[Callable[..., Any]] = (),
        workflows: Sequence[type] = TASK_WORKFLOWS,
        tracing: TracingInterceptor | None = None,
        strict_sandbox: bool = False,
    ) -> None:
        super().__init__(
            "onceflow",
            data_converter=onceflow_data_converter(encryption),
            activities=list(activities) or None,
            workflows=list(workflows),
        )
        self.tracing = tracing or tracing_interceptor()
        self.strict_sandbox = strict_sandbox

    def configure_client(self, config: ClientConfig) -> ClientConfig:
        config = super().configure_client(config)
        config["interceptors"] = [*config.get("interceptors", ()), self.tracing]
        return config

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        if self not in config.get("plugins", ()):
            return config  # a client's plugin: the worker's own configures it
        config = super().configure_worker(config)
        config["workflow_runner"] = workflow_runner(
            config["client"].data_converter, strict_sandbox=self.strict_sandbox
        )
        config["interceptors"] = [*config.get("interceptors", ()), AttemptAnnotations()]
        return config

    def configure_replayer(self, config: ReplayerConfig) -> ReplayerConfig:
        config = super().configure_replayer(config)
        config["workflow_runner"] = workflow_runner(
            config["data_converter"], strict_sandbox=self.strict_sandbox
        )
        config["interceptors"] = [
            *config.get("interceptors", ()),
            self.tracing,
            AttemptAnnotations(),
        ]
        return config
