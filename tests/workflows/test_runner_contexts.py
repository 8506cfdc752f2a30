"""The worker's runner answers the SDK's serialization-context questions itself
(``ContextFreeRunner``) only when its data converter cannot tell one context from another
(``converter_uses_context``)."""

import dataclasses
from collections.abc import Sequence
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    PayloadCodec,
    SerializationContext,
    StorageDriverStoreContext,
    WithSerializationContext,
)
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner

from onceflow.encryption import onceflow_data_converter
from onceflow.plugin import (
    ContextFreeRunner,
    DeliveredEventsRunner,
    converter_uses_context,
    workflow_runner,
)
from onceflow.settings import OnceflowSettings
from onceflow.storage import build_pool
from onceflow.worker import build_worker
from tests.encryption.conftest import encryption_settings
from tests.tool_configuration import builtin


class ContextBoundCodec(PayloadCodec, WithSerializationContext):
    """A codec that binds each context (as one keying by workflow id would)."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> "ContextBoundCodec":
        return ContextBoundCodec(context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)


def test_onceflows_converters_use_no_context_and_a_context_bound_codec_does() -> None:
    assert not converter_uses_context(onceflow_data_converter())
    assert not converter_uses_context(onceflow_data_converter(encryption_settings()))
    bound = dataclasses.replace(onceflow_data_converter(), payload_codec=ContextBoundCodec())
    assert converter_uses_context(bound)


class RecordingInstance(WorkflowInstance):
    """Stands for the sandboxed instance: records the context questions it answers."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def activate(self, act: Any) -> Any:
        raise NotImplementedError

    def get_info(self) -> Any:
        raise NotImplementedError

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        self.asked.append("serialization")
        return None

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        self.asked.append("external store")
        return StorageDriverStoreContext()


class RecordingRunner(WorkflowRunner):
    def __init__(self) -> None:
        self.instance = RecordingInstance()

    def prepare_workflow(self, defn: Any) -> None:
        pass

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return self.instance


def test_the_inner_instance_is_asked_only_without_the_context_free_runner() -> None:
    for wrap, asked in (
        (DeliveredEventsRunner, ["serialization", "external store"]),
        (ContextFreeRunner, []),
    ):
        inner = RecordingRunner()
        instance = wrap(inner).create_instance(None)  # type: ignore[arg-type]
        assert instance.get_serialization_context(None) is None
        assert instance.get_external_store_context(None) == StorageDriverStoreContext()
        assert inner.instance.asked == asked


def test_the_context_free_runner_wraps_only_a_converter_that_uses_no_context() -> None:
    assert isinstance(workflow_runner(onceflow_data_converter()), ContextFreeRunner)
    bound = dataclasses.replace(onceflow_data_converter(), payload_codec=ContextBoundCodec())
    assert isinstance(workflow_runner(bound), DeliveredEventsRunner)


async def test_the_production_worker_answers_contexts_itself_for_onceflows_converter(
    postgres_url: str, task_queue: str, dev_server: Any
) -> None:
    settings = OnceflowSettings(task_queue=task_queue, shutdown_grace_seconds=1)
    async with (
        build_pool(postgres_url, max_size=1) as pool,
        build_worker(dev_server.client, pool, settings, tools=builtin()) as worker,
    ):
        runner = worker.config(active_config=True)["workflow_runner"]
        assert isinstance(runner, ContextFreeRunner)
