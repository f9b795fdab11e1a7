"""A tiny OTLP/HTTP trace receiver for tests: `POST /v1/traces` with a protobuf
`ExportTraceServiceRequest`, decoded with `opentelemetry-proto`; the spans are kept in memory.

    with OtlpReceiver() as otlp:
        ... boot payload with {"telemetry": {"otlp_endpoint": otlp.base_url}} ...
        span = otlp.wait_for(lambda s: s.name == "agent_driver.run", timeout=10)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-01"


@dataclass
class _State:
    spans: list[ReceivedSpan] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class _Handler(BaseHTTPRequestHandler):
    state: _State

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans: list[ReceivedSpan] = []
        for rs in request.resource_spans:
            resource = _attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            attributes=_attributes(s.attributes),
                            resource=resource,
                            status_code=int(s.status.code),
                            status_message=s.status.message,
                        )
                    )
        with self.state.changed:
            self.state.spans.extend(spans)
            self.state.headers.append({k.lower(): v for k, v in self.headers.items()})
            self.state.changed.notify_all()
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class OtlpReceiver:
    def __init__(self) -> None:
        self._state = _State()
        handler = type("Handler", (_Handler,), {"state": self._state})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="otlp-receiver")

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._state.changed:
            return list(self._state.spans)

    @property
    def headers(self) -> list[dict[str, str]]:
        with self._state.changed:
            return list(self._state.headers)

    def wait_for(self, predicate: Callable[[ReceivedSpan], bool], timeout: float = 10.0) -> ReceivedSpan:
        """The first received span matching `predicate`, waiting (blocking) up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._state.changed:
            while True:
                for span in self._state.spans:
                    if predicate(span):
                        return span
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no matching span within {timeout:g} s; got {[s.name for s in self._state.spans]}"
                    )
                self._state.changed.wait(left)
