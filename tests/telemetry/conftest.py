"""A real OTLP receiver in the test process, and a stack whose processes export to it.

The receiver is a gRPC server speaking the OTLP trace and metrics services; it decodes
``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` with ``opentelemetry-proto``
exactly as a collector would. ``onceflow worker`` and ``onceflow gateway`` run as real
processes configured only through ``OTEL_*`` variables, with payments pointed at the
local Stripe-compatible provider (served in the test's event loop) and JSON logs.
One stack serves the whole package; every test works in a tenant of its own. Tests that
send email add ``mail``: an ``onceflow relay`` process exporting to the same receiver and
delivering to an SMTP sink served in the test's event loop.
"""

import asyncio
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from onceflow_devstack.smtp_sink import RunningSink, running_smtp_sink
from onceflow_devstack.stripe_provider import ProviderConfig, ProviderControl, running_provider
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from onceflow.gateway import PrincipalStore
from onceflow.storage import build_pool
from onceflow.task_api import TaskClient
from onceflow.tools.worker import key_digest
from onceflow.workflows.task_models import TaskStatus
from tests.harness import (
    HANG_SECONDS,
    REPO,
    eventually,
    log_line,
    onceflow_command,
    passed_marker,
    wait_for,
)

PLANTED_STRIPE_KEY = "sk_test_PLANTEDstripeSECRET4f1c9e"
"""The workers' Stripe secret key: a secret that must never be exported or logged."""
STRIPE_ACCOUNT = "acct_onceflow_telemetry"


# ── the OTLP receiver ───────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as a collector received it."""

    service: str
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: list[str]
    """Trace ids of the spans this one links to."""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


class OtlpReceiver(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    """Keeps every OTLP export it receives, raw and decoded."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.endpoint = ""
        self.http_endpoint = ""

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the gRPC method name)
        with self._lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            self.metric_requests.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()

    def raw_exports(self) -> list[bytes]:
        """Every export request as the bytes that crossed the wire."""
        with self._lock:
            requests: list[Any] = [*self.trace_requests, *self.metric_requests]
        return [request.SerializeToString() for request in requests]

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            requests = list(self.trace_requests)
        found = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append(
                            ReceivedSpan(
                                service=str(resource.get("service.name")),
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                name=span.name,
                                kind=span.kind,
                                attributes={a.key: _value(a.value) for a in span.attributes},
                                links=[link.trace_id.hex() for link in span.links],
                            )
                        )
        return found

    def metric_points(self, name: str) -> list[tuple[dict[str, Any], float]]:
        """``(attributes, value)`` of every data point of a sum or gauge named ``name``."""
        with self._lock:
            requests = list(self.metric_requests)
        points = []
        for request in requests:
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        if metric.name != name:
                            continue
                        data = metric.sum if metric.HasField("sum") else metric.gauge
                        for point in data.data_points:
                            value = (
                                point.as_int
                                if point.WhichOneof("value") == "as_int"
                                else point.as_double
                            )
                            attributes = {a.key: _value(a.value) for a in point.attributes}
                            points.append((attributes, float(value)))
        return points

    def metric_exports(self, service: str) -> int:
        """How many metric exports ``service`` has sent so far."""
        with self._lock:
            requests = list(self.metric_requests)
        return sum(
            1
            for request in requests
            if any(
                attribute.key == "service.name" and _value(attribute.value) == service
                for resource_metrics in request.resource_metrics
                for attribute in resource_metrics.resource.attributes
            )
        )

    async def wait_for_spans(
        self, done: Callable[[list[ReceivedSpan]], bool], *, timeout: float = HANG_SECONDS
    ) -> list[ReceivedSpan]:
        """Poll until ``done`` holds for the spans (or metrics) received so far."""

        def received() -> str:
            spans = self.spans()
            return f"the awaited spans arrive; {len(spans)} received: " + str(
                sorted({span.name for span in spans})
            )

        return await eventually(
            self.spans, until=done, what=received, timeout=timeout, interval=0.1
        )


@pytest.fixture(scope="package")
def otlp() -> Iterator[OtlpReceiver]:
    """An OTLP receiver on free local ports: gRPC at ``endpoint``, HTTP at ``http_endpoint``."""
    receiver = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    receiver.endpoint = f"http://127.0.0.1:{port}"

    class OtlpHttp(BaseHTTPRequestHandler):
        """OTLP/HTTP with protobuf bodies: ``POST /v1/traces`` and ``/v1/metrics``."""

        def do_POST(self) -> None:  # noqa: N802 (the http.server method name)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            request: Any
            if self.path == "/v1/traces":
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            else:
                request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            answer = receiver.Export(request, None).SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), OtlpHttp)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    receiver.http_endpoint = f"http://127.0.0.1:{http_server.server_address[1]}"
    yield receiver
    http_server.shutdown()
    server.stop(grace=None)


# ── the stack ───────────────────────────────────────────────────────────────────────


@dataclass
class OnceflowProcess:
    """A running onceflow command and the file holding everything it wrote."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path
    ready_line: str = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def stop(self) -> None:
        """SIGTERM, as a deployment stops it: the process flushes its telemetry."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), HANG_SECONDS)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def start_onceflow(
    name: str, arguments: list[str], env: dict[str, str], log_path: Path, ready: str
) -> OnceflowProcess:
    """Start ``onceflow ARGUMENTS`` and wait for the line announcing it is ready."""
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *onceflow_command(*arguments),
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
        )
    running = OnceflowProcess(name, process, log_path)
    try:
        running.ready_line = await log_line(process, log_path, ready)
    except BaseException:
        await running.stop()
        raise
    return running


@dataclass
class TelemetryStack:
    """The package's worker and gateway processes, their provider and receiver."""

    client: Client
    tasks: TaskClient
    control: ProviderControl
    otlp: OtlpReceiver
    gateway_url: str
    database_url: str
    env: dict[str, str]
    """The environment the worker and the gateway run with (the CLI and relay reuse it)."""
    logs_dir: Path
    processes: list[OnceflowProcess] = field(default_factory=list)

    def logs(self) -> str:
        """Everything the worker and gateway processes logged so far."""
        return "\n".join(process.log() for process in self.processes)

    async def new_agent(
        self, *, tools: tuple[str, ...], may_decide: bool = True
    ) -> tuple[str, dict[str, str]]:
        """A principal of a fresh tenant: ``(tenant, Authorization header)``."""
        tenant = f"otel-{uuid.uuid4().hex[:10]}"
        async with build_pool(self.database_url, max_size=1) as pool:
            _, api_key = await PrincipalStore(pool).create(
                tenant=tenant, name="agent-1", tools=tools, may_decide=may_decide
            )
        return tenant, {"Authorization": f"Bearer {api_key}"}

    async def wait_for_state(
        self, workflow_id: str, done: Callable[[TaskStatus], bool], *, timeout: float = HANG_SECONDS
    ) -> TaskStatus:
        """Poll the task's status query until ``done`` holds."""
        return await wait_for(self.tasks, workflow_id, done, timeout=timeout)

    async def caught_up(self) -> None:
        """Prove the worker's and the gateway's telemetry went quiet up to now.

        A marker call (a coupon, in a tenant of its own) goes through both processes after
        everything the test did. Each process exports its spans from one queue in the order
        they ended and writes its log through one stream, so once the marker's spans have
        reached the receiver and its lines are in both logs, everything before it is there
        too. Then two more metric exports from each process: the second was collected
        after the first arrived, so it holds every measurement made before the marker.
        """
        _, auth = await self.new_agent(tools=("issue_coupon",))
        key = f"marker-{uuid.uuid4().hex}"

        async def send() -> str:
            async with httpx.AsyncClient(timeout=HANG_SECONDS) as http:
                answer = await http.post(
                    f"{self.gateway_url}/v1/tools/issue_coupon/calls",
                    json={"user_id": key, "coupon_id": "MARKER"},
                    headers={**auth, "Idempotency-Key": key},
                )
            assert answer.status_code in (200, 202), answer.text
            task_id = str(answer.json()["task_id"])
            await self.tasks.result(task_id)
            return task_id

        def spans_of(task_id: str) -> set[str]:
            return {
                span.service
                for span in self.otlp.spans()
                if span.attributes.get("temporalWorkflowID") == task_id
                or span.attributes.get("onceflow.workflow_id") == task_id
                or span.attributes.get("onceflow.key_digest") == key_digest(key)
            }

        await passed_marker(
            send,
            lambda task_id: {"onceflow-worker", "onceflow-gateway"} <= spans_of(task_id),
            *(
                lambda task_id, process=process: task_id in process.log()
                for process in self.processes
            ),
            what="the worker's and the gateway's span exporters and logs",
        )
        for service in ("onceflow-worker", "onceflow-gateway"):
            exported = self.otlp.metric_exports(service)
            await eventually(
                lambda service=service: self.otlp.metric_exports(service),
                until=lambda count, exported=exported: count >= exported + 2,
                what=f"two more metric exports from {service}",
            )


@pytest.fixture(scope="package")
async def stack(
    dev_server: WorkflowEnvironment,
    postgres_url: str,
    otlp: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[TelemetryStack]:
    """``onceflow worker`` and ``onceflow gateway`` exporting to ``otlp``, JSON-logging."""
    task_queue = f"otel-{uuid.uuid4().hex[:10]}"
    logs = tmp_path_factory.mktemp("telemetry-logs")
    async with (
        running_provider(ProviderConfig()) as provider,
        ProviderControl(provider.base_url) as control,
    ):
        env = {
            "TEMPORAL_ADDRESS": dev_server.client.service_client.config.target_host,
            "DATABASE_URL": postgres_url,
            "ONCEFLOW_TASK_QUEUE": task_queue,
            "ONCEFLOW_SHUTDOWN_GRACE_SECONDS": "2",
            "STRIPE_API_BASE": provider.base_url,
            "STRIPE_API_KEY": PLANTED_STRIPE_KEY,
            # Every built-in tool but the deployment, whose target this stack lacks.
            "ONCEFLOW_BUILTIN_TOOLS": "issue_coupon,create_order,charge_payment,refund_payment,"
            "send_email",
            "ONCEFLOW_STRIPE_ACCOUNT": STRIPE_ACCOUNT,
            "ONCEFLOW_STRIPE_CONNECT_TIMEOUT": "PT0.5S",
            "ONCEFLOW_STRIPE_REQUEST_TIMEOUT": "PT1S",
            "ONCEFLOW_PAYMENTS_ATTEMPT_TIMEOUT": "PT4S",
            "ONCEFLOW_GATEWAY_REPLAY_WAIT_SECONDS": "1",
            "ONCEFLOW_PARKED_SCAN_SECONDS": "0.5",
            "ONCEFLOW_LOG_FORMAT": "json",
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
            "PYTHONUNBUFFERED": "1",
        }
        worker, gateway = await asyncio.gather(
            start_onceflow("worker", ["worker"], env, logs / "worker.log", "onceflow worker ready"),
            start_onceflow(
                "gateway",
                ["gateway", "--port", "0"],
                env,
                logs / "gateway.log",
                "onceflow gateway ready on ",
            ),
        )
        url = gateway.ready_line.split("onceflow gateway ready on ", 1)[1].split()[0]
        try:
            yield TelemetryStack(
                client=dev_server.client,
                tasks=TaskClient(dev_server.client, task_queue=task_queue),
                control=control,
                otlp=otlp,
                gateway_url=url,
                database_url=postgres_url,
                env=env,
                logs_dir=logs,
                processes=[worker, gateway],
            )
        finally:
            await asyncio.gather(worker.stop(), gateway.stop())


@dataclass
class MailRelay:
    """The package's ``onceflow relay`` process and the SMTP sink it delivers to."""

    sink: RunningSink
    relay: OnceflowProcess


@pytest.fixture(scope="package")
async def mail(stack: TelemetryStack) -> AsyncIterator[MailRelay]:
    """``onceflow relay`` exporting to ``otlp``, delivering the stack's emails to a sink."""
    async with running_smtp_sink() as sink:
        relay = await start_onceflow(
            "relay",
            ["relay"],
            {**stack.env, "SMTP_URL": sink.smtp_url, "ONCEFLOW_EMAIL_POLL_INTERVAL": "PT0.1S"},
            stack.logs_dir / "relay.log",
            "ready, delivering to",
        )
        try:
            yield MailRelay(sink=sink, relay=relay)
        finally:
            await relay.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that never retries by itself."""
    async with httpx.AsyncClient(timeout=HANG_SECONDS) as client:
        yield client
