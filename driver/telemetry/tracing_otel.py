"""Spans exported over OTLP/HTTP with the OpenTelemetry SDK (PROTOCOL §6.6).

Imported only when a boot payload names `telemetry.otlp_endpoint`: the SDK and the exporter cost tens
of milliseconds to import, which a driver without telemetry must not pay at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

# Spans are few (a session, its runs, their waits): export them soon so a sandbox that dies loses little.
EXPORT_DELAY_MS = 500
_propagator = TraceContextTextMapPropagator()


class OtelSpan:
    def __init__(self, span: trace.Span) -> None:
        self._span = span
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, context=trace.set_span_in_context(span))
        self._traceparent = carrier.get("traceparent")

    @property
    def traceparent(self) -> str | None:
        return self._traceparent

    def end(self, error: str | None = None) -> None:
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()


class OtelTracer:
    def __init__(self, endpoint: str, headers: Mapping[str, str], resource: Mapping[str, str]) -> None:
        # As OTEL_EXPORTER_OTLP_ENDPOINT: a base URL to which the signal's path is appended.
        url = endpoint.rstrip("/") + "/v1/traces"
        self._provider = TracerProvider(resource=Resource.create({"service.name": "agent-driver", **resource}))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=url, headers=dict(headers)), schedule_delay_millis=EXPORT_DELAY_MS
            )
        )
        self._tracer = self._provider.get_tracer("agent-driver")

    def start(self, name: str, parent: str | None, attributes: Mapping[str, Any] | None = None) -> OtelSpan:
        context = _propagator.extract({"traceparent": parent}) if parent else None
        span = self._tracer.start_span(name, context=context, attributes=dict(attributes or {}))
        return OtelSpan(span)

    def shutdown(self, timeout_s: float) -> None:
        """Export what is buffered (blocking: call it from a worker thread)."""
        self._provider.force_flush(int(timeout_s * 1000))
        self._provider.shutdown()
