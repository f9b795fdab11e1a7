"""The Claude Code CLI the SDK runs for a session: its client, its process group, its exit, its stderr.

The SDK starts the CLI as its transport's child; with the launcher (claude_options.launch_command) the
CLI leads a process group of its own, which goes with it when it is disconnected (shell tools, MCP
servers). Every CLI started is recorded for containment, so the next driver process can clean up
after this one.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import anyio
import claude_agent_sdk as sdk

from driver import containment
from driver.adapters.base import ProviderError
from driver.adapters.claude_turn import cli_pid

STDERR_LINES = 200
STDERR_LINE_CHARS = 2000
DISCONNECT_TIMEOUT_S = 10.0


class ResumeFailed(Exception):
    pass


class ClaudeCli:
    def __init__(self, redact: Callable[[str], str]) -> None:
        self.client: Any = None
        self.launcher_used = False  # set with each client's options: the CLI then leads its own group
        self.connect_seconds: float | None = None  # measured, for driver.started timings
        self._redact = redact
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)

    def on_stderr(self, line: str) -> None:
        self._stderr.append(line[:STDERR_LINE_CHARS])

    def stderr_tail(self) -> str:
        return self._redact("\n".join(self._stderr))

    async def connect(self, options: Any, *, resume: str | None) -> None:
        """Start a CLI with `options`; `ResumeFailed` when it was to resume `resume` and did not start."""
        client = sdk.ClaudeSDKClient(options)
        started = time.monotonic()
        try:
            await client.connect()
        except Exception as exc:
            with anyio.CancelScope(shield=True):
                await self.disconnect(client)
            message = self._redact(str(exc))
            if resume is not None:
                raise ResumeFailed(f"could not resume Claude session {resume}: {message}") from None
            raise ProviderError(
                "provider.start_failed",
                f"Claude Code did not start: {message}",
                retryable=True,
                details={"stderr_tail": self.stderr_tail()},
            ) from None
        self.connect_seconds = time.monotonic() - started
        self.client = client
        if (pid := cli_pid(client)) is not None:
            containment.started(pid)  # so the next driver process can clean up after this one

    async def stop(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await self.disconnect(client)

    async def disconnect(self, client: Any) -> None:
        pgid = self._pgid(client)
        pid = cli_pid(client)
        # Shielded: stop() is often reached while being cancelled. A dead CLI must not make it raise.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(DISCONNECT_TIMEOUT_S),
            contextlib.suppress(Exception),
        ):
            await client.disconnect()
        if pgid is not None:
            # Whatever the CLI left behind in its group (shell tools, MCP servers) goes with it.
            with contextlib.suppress(PermissionError):
                containment.kill_group(pgid, signal.SIGKILL)
        if pid is not None:
            containment.ended(pid)

    def _pgid(self, client: Any) -> int | None:
        if not self.launcher_used:
            return None  # without the launcher the CLI shares the driver's own group
        process = getattr(getattr(client, "_transport", None), "_process", None)
        pid = getattr(process, "pid", None)
        if not isinstance(pid, int) or getattr(process, "returncode", None) is not None:
            return None
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return None
        return pgid if pgid == pid and pgid != os.getpgrp() else None

    def group_ids(self) -> list[int]:
        pgid = self._pgid(self.client) if self.client is not None else None
        return [pgid] if pgid is not None else []

    async def wait_exited(self) -> None:
        # The CLI is the SDK transport's child process. Watch whichever client is current: stop() and
        # reset() drop `client` before disconnecting, so an exit we caused is never reported.
        while True:
            client = self.client
            process = getattr(getattr(client, "_transport", None), "_process", None)
            if process is None:
                await anyio.sleep(0.5)  # not connected (stopped, or between reset's stop and connect)
                continue
            await process.wait()
            if self.client is client:
                return
