"""A process's telemetry: exported over gRPC or HTTP when asked, flushed at exit, else off.

The flush is what keeps the spans of a worker's last attempts when it is stopped: the
batch processor here would wait ten minutes, so only the shutdown can deliver them.
"""

import asyncio
import json
import logging
import os
import sys

import pytest

from onceflow.telemetry import configure_tracing, log_fields
from onceflow.telemetry._logging import JsonLogFormatter, TextLogFormatter
from tests.harness import REPO

from .conftest import OtlpReceiver

LAST_WORDS = """
import asyncio
from opentelemetry import trace
from onceflow.telemetry import process_telemetry

async def main() -> None:
    async with process_telemetry("flush-check"):
        with trace.get_tracer("check").start_as_current_span("last words"):
            pass

asyncio.run(main())
"""


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
async def test_a_stopping_process_flushes_its_spans_over_the_configured_protocol(
    otlp: OtlpReceiver, protocol: str
) -> None:
    endpoint = otlp.endpoint if protocol == "grpc" else otlp.http_endpoint
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LAST_WORDS,
        cwd=REPO,
        env={
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_SERVICE_NAME": f"flush-check-{protocol}",
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "OTEL_METRIC_EXPORT_INTERVAL": "600000",
        },
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    assert [span.name for span in otlp.spans() if span.service == f"flush-check-{protocol}"] == [
        "last words"
    ]


def test_nothing_is_exported_without_an_otlp_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    assert configure_tracing("unconfigured") is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert configure_tracing("switched-off") is None


def test_log_records_carry_the_attempt_fields_and_lose_secrets() -> None:
    record = logging.LogRecord(
        "onceflow.attempts",
        logging.INFO,
        __file__,
        1,
        "charge with card %s and key %s",
        ("4242 4242 4242 4242", "sk_live_abcdef123456"),
        None,
    )
    record.onceflow = {"onceflow.step": "pay", "onceflow.attempt": 2}
    record.trace_id = "0af7651916cd43dd8448eb211c80319c"
    document = json.loads(JsonLogFormatter("test").format(record))
    assert document["message"] == "charge with card [card number removed] and key [secret removed]"
    assert document["onceflow.step"] == "pay" and document["onceflow.attempt"] == 2
    assert document["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    text = TextLogFormatter().format(record)
    assert "4242" not in text and "sk_live" not in text
    assert "onceflow.attempt=2" in text
    assert log_fields(record)["onceflow.step"] == "pay"


def test_trace_ids_pass_as_ids_and_anything_else_under_their_names_is_scrubbed() -> None:
    record = logging.LogRecord("onceflow", logging.INFO, __file__, 1, "hello", (), None)
    record.trace_id, record.span_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    assert log_fields(record) == {
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
    }
    # A caller's own ``extra={"trace_id": ...}`` is text like any other field.
    record.trace_id, record.span_id = "key sk_live_abcdef1234567890", "4242 4242 4242 4242"
    assert log_fields(record) == {
        "trace_id": "key [secret removed]",
        "span_id": "[card number removed]",
    }
