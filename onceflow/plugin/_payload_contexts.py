"""The workflow runner wrapper that answers the SDK's payload-context questions itself.

The SDK asks a workflow instance for the serialization and external-storage context of
every payload of every activation and completion, three passes each, and the sandbox
answers each by running code inside it: 14% of the worker's busy samples in a one-step
task (``python -m bench.task_overhead --profile DIR``). A data converter that uses no
context (``converter_uses_context``) converts a payload the same under any context, so
answering without the sandbox cannot change a byte; `ContextFreeRunner` is used only then.
"""

from __future__ import annotations

from typing import Any

import temporalio.workflow
from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    StorageDriverStoreContext,
    WorkflowSerializationContext,
)
from temporalio.worker import (
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)


def converter_uses_context(converter: DataConverter) -> bool:
    """Whether ``converter`` converts a payload differently under some serialization or
    external-storage context: it stores payloads externally, or a part of it (payload
    converter, codec, failure converter) answers a context with another object. The
    pydantic converter, with or without onceflow's encryption codec, uses none."""
    if converter.external_storage is not None:
        return True
    probes = (
        WorkflowSerializationContext(namespace="probe", workflow_id="probe"),
        ActivitySerializationContext(
            namespace="probe",
            activity_id="probe",
            workflow_id="probe",
            workflow_type="probe",
            activity_type="probe",
            activity_task_queue="probe",
            is_local=False,
        ),
    )
    return any(converter.with_context(probe) is not converter for probe in probes)


class ContextFreeRunner(WorkflowRunner):
    """Wraps a runner so that its instances answer the context questions without it: no
    serialization context (the converter as it is), no external storage.

    Only for a worker or replayer whose data converter uses no context
    (``converter_uses_context`` is False); with one that does, the answers would be wrong.

    Args:
        inner: The runner that runs the workflows.
    """

    def __init__(self, inner: WorkflowRunner) -> None:
        self._inner = inner

    def prepare_workflow(self, defn: temporalio.workflow._Definition) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _ContextFreeInstance(self._inner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._inner.set_worker_level_failure_exception_types(types)


class _ContextFreeInstance(WorkflowInstance):
    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self._inner.activate(act)

    def get_serialization_context(self, *args: Any, **kwargs: Any) -> Any:
        return None  # the worker's converter itself, which every context leaves as is

    def get_external_store_context(self, *args: Any, **kwargs: Any) -> Any:
        return StorageDriverStoreContext()  # nothing is stored externally

    def get_info(self) -> temporalio.workflow.Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()
