"""A stand-in OpenTelemetry collector for the benchmarks, in a process of its own.

``python -m bench._otlp_sink`` serves the OTLP trace and metrics services over gRPC (the
protocol onceflow's processes use by default) on a free port of 127.0.0.1, prints
``otlp sink ready on http://127.0.0.1:PORT``, decodes every export as a collector would
and keeps only counts. On SIGTERM or SIGINT it prints one JSON line with the spans
received per service and span name, and exits. Its own CPU is the collector's, not the
traced process's: a benchmark meters it apart.
"""

import json
import signal
import threading
from collections import Counter
from concurrent import futures
from typing import Any

import grpc  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

READY = "otlp sink ready on "


class CountingReceiver(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    """Counts the spans of every trace export and the metric exports."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: Counter[str] = Counter()
        self.trace_exports = 0
        self.metric_exports = 0

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the gRPC method name)
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            counted: Counter[str] = Counter()
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        attribute.value.string_value
                        for attribute in resource_spans.resource.attributes
                        if attribute.key == "service.name"
                    ),
                    "?",
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        counted[f"{service}: {span.name.split(':')[0]}"] += 1
            with self._lock:
                self.spans.update(counted)
                self.trace_exports += 1
            return trace_service_pb2.ExportTraceServiceResponse()
        with self._lock:
            self.metric_exports += 1
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def counts(self) -> dict[str, Any]:
        with self._lock:
            return {
                "spans": sum(self.spans.values()),
                "trace_exports": self.trace_exports,
                "metric_exports": self.metric_exports,
                "spans_by_service_and_name": dict(sorted(self.spans.items())),
            }


def serve() -> None:
    receiver = CountingReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    print(f"{READY}http://127.0.0.1:{port}", flush=True)
    stopped.wait()
    server.stop(grace=2).wait()
    print(json.dumps(receiver.counts()), flush=True)


if __name__ == "__main__":
    serve()
