"""Terminal plumbing of the chat: stdin lines and signals become actions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, TextIO

from agent_lab.dev.common import Action


def start_stdin_reader(loop: asyncio.AbstractEventLoop, push: Callable[[Action], None]) -> None:
    """Read stdin lines in a daemon thread. `os.read` (not `sys.stdin`) so that an exit while the
    thread is blocked does not fight over the buffered reader's lock at interpreter shutdown."""

    def deliver(action: Action) -> bool:
        try:
            loop.call_soon_threadsafe(push, action)
        except RuntimeError:  # the loop is closed: we are exiting
            return False
        return True

    def read() -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(0, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                if pending:
                    deliver(("line", pending.decode(errors="replace")))
                deliver(("eof", None))
                return
            pending += chunk
            while b"\n" in pending:
                line, _, pending = pending.partition(b"\n")
                if not deliver(("line", line.decode(errors="replace"))):
                    return

    threading.Thread(target=read, name="dev-stdin", daemon=True).start()


@contextlib.contextmanager
def signals_to_actions(loop: asyncio.AbstractEventLoop, push: Callable[[Action], None]) -> Any:
    """Ctrl-C becomes an action (cancel the run, or quit); SIGTERM/SIGHUP stop the session."""
    handlers = {
        signal.SIGINT: ("interrupt", None),
        signal.SIGTERM: ("stop", "SIGTERM"),
        signal.SIGHUP: ("stop", "SIGHUP"),
    }
    for sig, action in handlers.items():
        loop.add_signal_handler(sig, push, action)
    try:
        yield
    finally:
        for sig in handlers:
            loop.remove_signal_handler(sig)


def wants_color(out: TextIO) -> bool:
    return out.isatty() and not os.environ.get("NO_COLOR")
