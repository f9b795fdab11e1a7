"""Trace context for the driver's spans and its provider (PROTOCOL §6.6), cheap to import.

Without `telemetry.otlp_endpoint` nothing is exported and no OpenTelemetry module is loaded: spans are
`PassThrough` handles whose trace context is their parent's, so a `traceparent` from the boot payload
or an `input.start` still reaches the provider unchanged. With an endpoint, `tracing_otel` (which
imports the SDK) records real spans and exports them over OTLP/HTTP.

The run's trace context reaches the adapter through a context variable (`run_traceparent()`): the
run path sets it in the task that then calls `adapter.run()`, so no adapter signature changes.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Mapping
from typing import Any, Protocol

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")

_run_traceparent: contextvars.ContextVar[str | None] = contextvars.ContextVar("run_traceparent", default=None)


def valid(traceparent: str | None) -> str | None:
    """The value if it is a W3C traceparent (an invalid one is ignored, never an error), else None."""
    if traceparent and TRACEPARENT.match(traceparent) and not traceparent.startswith("ff"):
        trace_id = traceparent[3:35]
        span_id = traceparent[36:52]
        if trace_id != "0" * 32 and span_id != "0" * 16:
            return traceparent
    return None


def run_traceparent() -> str | None:
    """The trace context of the run being executed in this task (for the provider's request)."""
    return _run_traceparent.get()


def set_run_traceparent(traceparent: str | None) -> None:
    _run_traceparent.set(traceparent)


class Span(Protocol):
    @property
    def traceparent(self) -> str | None: ...

    def end(self, error: str | None = None) -> None: ...


class Tracer(Protocol):
    def start(self, name: str, parent: str | None, attributes: Mapping[str, Any] | None = None) -> Span: ...

    def shutdown(self, timeout_s: float) -> None: ...


class PassThrough:
    """A span that records nothing: its context is its parent's."""

    def __init__(self, parent: str | None) -> None:
        self._parent = parent

    @property
    def traceparent(self) -> str | None:
        return self._parent

    def end(self, error: str | None = None) -> None:
        pass


class NoTracer:
    def start(self, name: str, parent: str | None, attributes: Mapping[str, Any] | None = None) -> Span:
        return PassThrough(parent)

    def shutdown(self, timeout_s: float) -> None:
        pass


def make_tracer(telemetry: Any, environment: Mapping[str, str], resource: Mapping[str, str]) -> Tracer:
    """`NoTracer` without an endpoint; else the OpenTelemetry exporter (imported only now)."""
    if telemetry is None or not telemetry.otlp_endpoint:
        return NoTracer()
    try:
        from driver.telemetry.tracing_otel import OtelTracer
    except ImportError as exc:
        # An image built without the `telemetry` extra: the session goes on untraced, and says why.
        from driver import logs

        logs.get("driver.telemetry").error("telemetry.unavailable", error=str(exc))
        return NoTracer()

    headers = {name: environment[var] for name, var in telemetry.headers_from_env.items() if var in environment}
    return OtelTracer(telemetry.otlp_endpoint, headers, resource)
