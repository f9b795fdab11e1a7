"""The Claude Code CLI of a session: the current client (claude_client.py), its start, exit and stderr.

The CLI leads a process group of its own and runs inside the provider containment
(driver/adapters/common/process.py), so its shell tools and MCP servers go with it when it is stopped; every
CLI started is recorded for containment, so the next driver process can clean up after this one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import anyio

from driver.adapters.claude import control
from driver.adapters.claude.client import ClaudeClient, ClientClosed, OnPermission, OnProblem, StartFailed
from driver.adapters.claude.command import Launch
from driver.adapters.common.base import ProviderError

STOP_GRACE_S = 3.0


class ResumeFailed(Exception):
    pass


class ClaudeCli:
    def __init__(self, redact: Callable[[str], str]) -> None:
        self.client: ClaudeClient | None = None
        self.connect_seconds: float | None = None  # measured, for driver.started timings
        self.initialize_answer: dict[str, object] = {}
        self._redact = redact
        self._last_tail = ""  # the stderr of the last CLI that failed to start
        self._changed = anyio.Event()

    def stderr_tail(self) -> str:
        client = self.client
        return client.proc.stderr_tail() if client is not None else self._last_tail

    def _set(self, client: ClaudeClient | None) -> None:
        self.client = client
        self._changed.set()
        self._changed = anyio.Event()

    async def connect(
        self, launch: Launch, *, cwd: str | Path, resume: str | None, on_permission: OnPermission, on_problem: OnProblem
    ) -> None:
        """Start a CLI; `ResumeFailed` when it was to resume `resume` and did not start."""
        started = time.monotonic()
        try:
            client, self.initialize_answer = await ClaudeClient.open(
                launch.argv,
                env=launch.env,
                cwd=cwd,
                initialize=launch.initialize,
                on_permission=on_permission,
                on_problem=on_problem,
            )
        except StartFailed as exc:
            self._last_tail = exc.stderr_tail
            message = self._redact(str(exc))
            if resume is not None:
                raise ResumeFailed(f"could not resume Claude session {resume}: {message}") from None
            raise ProviderError(
                "provider.start_failed",
                f"Claude Code did not start: {message}",
                retryable=True,
                details={"stderr_tail": self._last_tail},
            ) from None
        self.connect_seconds = time.monotonic() - started
        self._set(client)

    async def stop(self) -> None:
        client = self.client
        self._set(None)
        if client is not None:
            await client.close(grace=STOP_GRACE_S)
            self._last_tail = client.proc.stderr_tail()

    async def query(self, message: dict[str, object]) -> None:
        client = self.client
        if client is None:
            raise ClientClosed("the Claude Code CLI is not running")
        await client.send(message)

    async def interrupt(self) -> None:
        client = self.client
        if client is not None:
            await client.request(control.INTERRUPT)

    def group_ids(self) -> list[int]:
        client = self.client
        if client is None or client.proc.returncode is not None:
            return []
        return [client.proc.pgid]

    async def wait_exited(self) -> None:
        # Watch whichever client is current: stop() and reset() drop `client` before ending it, so an
        # exit we caused is never reported.
        while True:
            client = self.client
            if client is None:
                await self._changed.wait()
                continue
            await client.proc.exited.wait()
            if self.client is client:
                return
