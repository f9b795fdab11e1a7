"""What every fake model endpoint shares: a threaded HTTP server on loopback, served from a
background thread, closable, usable as a context manager, and runnable from the command line."""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self, TypeVar

F = TypeVar("F", bound="ServedFake")


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A provider that hangs up mid-stream (a cancel does exactly that) is not an error of the fake.
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            return
        super().handle_error(request, client_address)


class JsonHandler(BaseHTTPRequestHandler):
    """Request plumbing the fakes share: read a JSON body, answer JSON, stay quiet."""

    protocol_version = "HTTP/1.1"
    # The header a real API puts its request id in (Anthropic: request-id; OpenAI: x-request-id).
    request_id_header: ClassVar[str] = "request-id"

    def setup(self) -> None:
        super().setup()
        # As a real API's front end does: each event goes out when written. Without it the event after
        # the response head waits for the client's delayed ACK (~40 ms) when the client is an asyncio
        # one (httpx2's AsyncClient, the driver's model proxy), which no real endpoint makes it do.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read the fake's recorded requests instead

    def _read_body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode("utf-8", "replace")

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header(self.request_id_header, "req_fake_" + uuid.uuid4().hex[:12])
        self.end_headers()
        self.wfile.write(data)


class ServedFake:
    """Base of a fake: call `_serve(server, name)` from `__init__`; `close()` stops it."""

    closing: threading.Event
    _server: QuietServer
    _thread: threading.Thread

    def _serve(self, server: QuietServer, name: str) -> None:
        self.closing = threading.Event()
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_until_interrupted(fake: ServedFake, label: str) -> None:
    print(f"{label} on {getattr(fake, 'base_url', fake.port)}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        fake.close()


def listen_or_exit(make: Callable[[], F], host: str, port: int, label: str) -> F:
    """`make()`, the fake listening; a port already taken ends the process with one line naming the
    port and what to do (exit 1), never a traceback: a newcomer's second `python -m ... --port 8089`."""
    try:
        return make()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise SystemExit(
                f"{label}: port {port} on {host} is already in use (is one already running there?): "
                "stop that one, or pass another --port (and point the base URL at it)"
            ) from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise SystemExit(f"{label}: cannot listen on {host}:{port}: no such local address (--host)") from None
        raise
