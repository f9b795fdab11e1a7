"""What every fake model endpoint shares: a threaded HTTP server on loopback, served from a
background thread, closable, usable as a context manager, and runnable from the command line."""

from __future__ import annotations

import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any, Self


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A provider that hangs up mid-stream (a cancel does exactly that) is not an error of the fake.
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            return
        super().handle_error(request, client_address)


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
