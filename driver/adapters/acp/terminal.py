"""The client side of ACP `terminal/*`: commands the agent asks us to run, with bounded output.

Each terminal is a child process in its own process group (so `kill` and `release` take the whole
tree down, not just the shell), stdout and stderr merged, stdin closed. Output is kept in a byte
buffer capped at the agent's `outputByteLimit` (and never above our own ceiling); when it overflows,
the oldest bytes are dropped, as the spec asks, and the cut is moved to a UTF-8 character boundary.

Background readers run as tasks on the asyncio loop, like `ProviderProcess`'s (a terminal outlives
the `terminal/create` request that made it); `release()` and `close()` retire them.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.abc

from driver import containment

DEFAULT_OUTPUT_LIMIT = 1024 * 1024
MAX_OUTPUT_LIMIT = 16 * 1024 * 1024
MAX_TERMINALS = 32


class TerminalError(Exception):
    """Refused or unknown terminal; the message names the problem (sent to the agent)."""


OutputListener = Callable[[str, bytes], Awaitable[None]]


class Terminal:
    def __init__(
        self, terminal_id: str, process: anyio.abc.Process, limit: int, on_output: OutputListener | None = None
    ) -> None:
        self.id = terminal_id
        self._on_output = on_output
        self.process = process
        self.limit = limit
        self.buffer = bytearray()
        self.truncated = False
        self.exited = anyio.Event()
        self._read_done = anyio.Event()
        loop = asyncio.get_running_loop()
        self._tasks = (
            loop.create_task(self._read(), name=f"terminal-{terminal_id}-read"),
            loop.create_task(self._watch(), name=f"terminal-{terminal_id}-wait"),
        )

    async def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            async for chunk in self.process.stdout:
                self.buffer += chunk
                if len(self.buffer) > self.limit:
                    del self.buffer[: len(self.buffer) - self.limit]
                    self.truncated = True
                if self._on_output is not None:
                    await self._on_output(self.id, chunk)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass
        finally:
            self._read_done.set()

    async def _watch(self) -> None:
        try:
            await self.process.wait()
            # Let the last output arrive, but do not wait for a background grandchild that keeps
            # the pipe open after the command itself has exited.
            with anyio.move_on_after(1.0):
                await self._read_done.wait()
        finally:
            self.exited.set()

    def output(self) -> str:
        data = bytes(self.buffer)
        if self.truncated:
            # Do not start in the middle of a multi-byte character: skip continuation bytes.
            start = 0
            while start < len(data) and start < 4 and (data[start] & 0xC0) == 0x80:
                start += 1
            data = data[start:]
        return data.decode("utf-8", errors="replace")

    def exit_status(self) -> dict[str, Any] | None:
        code = containment.exit_status(self.process.returncode)
        if code is None or not self.exited.is_set():
            return None
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return {"exitCode": None, "signal": name}
        return {"exitCode": code, "signal": None}

    def kill(self) -> None:
        with contextlib.suppress(PermissionError):
            containment.kill_group(self.process.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.exited.wait()
        containment.ended(self.process.pid)
        for task in self._tasks:
            task.cancel()


class TerminalManager:
    def __init__(
        self,
        *,
        env: Mapping[str, str],
        default_cwd: Path,
        on_output: OutputListener | None = None,
        id_prefix: str = "term-",
    ) -> None:
        """`on_output(terminal_id, chunk)` is awaited with every chunk read (live output for events).
        `id_prefix`: a reattached driver's differs from its predecessor's, so a terminal id the agent
        kept from the dead driver never names one of this driver's (PROTOCOL §8.2)."""
        self._on_output = on_output
        self._id_prefix = id_prefix
        self._env = dict(env)
        self._default_cwd = default_cwd
        self._terminals: dict[str, Terminal] = {}
        self._ids = itertools.count(1)

    async def create(
        self,
        command: str,
        args: list[str],
        *,
        env: Mapping[str, str],
        cwd: Path | None,
        output_byte_limit: int | None,
    ) -> str:
        if len(self._terminals) >= MAX_TERMINALS:
            raise TerminalError(f"too many terminals open (limit {MAX_TERMINALS}); release some first")
        limit = DEFAULT_OUTPUT_LIMIT if output_byte_limit is None else output_byte_limit
        limit = max(0, min(limit, MAX_OUTPUT_LIMIT))
        full_env = {**self._env, **env}
        run_in = str(cwd or self._default_cwd)
        # The wrapper would turn these into its own exit status 1: say what is wrong instead.
        if not Path(run_in).is_dir():
            raise TerminalError(f"cannot start {command!r}: no such directory {run_in}")
        if shutil.which(command, path=full_env.get("PATH", os.defpath)) is None:
            raise TerminalError(f"cannot start {command!r}: No such file or directory")
        try:
            # Wrapped like a provider: a terminal the driver runs for the agent must not outlive it.
            process = await anyio.open_process(
                await containment.wrap_async([command, *args]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=run_in,
                env=full_env,
                start_new_session=True,
            )
        except OSError as exc:
            raise TerminalError(f"cannot start {command!r}: {exc.strerror or type(exc).__name__}") from None
        containment.started(process.pid)
        terminal_id = f"{self._id_prefix}{next(self._ids)}"
        self._terminals[terminal_id] = Terminal(terminal_id, process, limit, self._on_output)
        return terminal_id

    def get(self, terminal_id: str) -> Terminal:
        try:
            return self._terminals[terminal_id]
        except KeyError:
            raise TerminalError(f"unknown terminal {terminal_id!r}") from None

    def output(self, terminal_id: str) -> dict[str, Any]:
        term = self.get(terminal_id)
        return {"output": term.output(), "truncated": term.truncated, "exitStatus": term.exit_status()}

    async def wait_for_exit(self, terminal_id: str) -> dict[str, Any]:
        term = self.get(terminal_id)
        await term.exited.wait()
        status = term.exit_status()
        assert status is not None
        return status

    def kill(self, terminal_id: str) -> None:
        self.get(terminal_id).kill()

    async def release(self, terminal_id: str) -> None:
        term = self.get(terminal_id)
        del self._terminals[terminal_id]
        await term.close()

    async def close(self) -> None:
        for terminal_id in list(self._terminals):
            await self.release(terminal_id)

    def process_group_ids(self) -> list[int]:
        return [t.process.pid for t in self._terminals.values() if not t.exited.is_set()]


class _Turn(Protocol):
    terminals: dict[str, str]  # terminal id -> the tool call id that shows it
    new_terminals: list[str]  # linked since last looked at


class _Events(Protocol):
    async def emit(self, kind: str, payload: dict[str, Any]) -> None: ...


class TerminalStreams:
    """A terminal's output, live, as `tool.output.delta` of the tool call that shows it (ACP tool call
    content `{type: terminal, terminalId}`). What the terminal printed before the link is sent at
    link time, the rest as it is read."""

    def __init__(self, current_turn: Callable[[], _Turn | None], events: _Events) -> None:
        self._turn = current_turn
        self._events = events
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def reset(self) -> None:
        self._decoders = {}

    async def link(self, turn: _Turn, terminals: TerminalManager) -> None:
        linked, turn.new_terminals = turn.new_terminals, []
        for terminal_id in linked:
            try:
                terminal = terminals.get(terminal_id)
            except TerminalError:
                continue  # not one of ours (or already released)
            # No await between reading the buffer and linking: a chunk is either in this text or
            # streamed by output(), never both.
            text = terminal.output()
            self._decoders[terminal_id] = codecs.getincrementaldecoder("utf-8")(errors="replace")
            if text:
                await self._events.emit(
                    "tool.output.delta", {"tool_call_id": turn.terminals[terminal_id], "text": text}
                )

    async def output(self, terminal_id: str, chunk: bytes) -> None:
        turn, decoder = self._turn(), self._decoders.get(terminal_id)
        if turn is None or decoder is None or terminal_id not in turn.terminals:
            return
        text = decoder.decode(chunk)
        if text:
            await self._events.emit("tool.output.delta", {"tool_call_id": turn.terminals[terminal_id], "text": text})
