"""One Claude Code CLI process and the stream-json link to it: the driver's own client (no SDK import).

`ClaudeClient.open()` spawns the CLI (driver/adapters/common/process.py: exactly the provider environment,
a process group of its own, the containment every provider gets) and sends `initialize`. A read loop,
a task on the event loop for the life of the process (it outlives every adapter call, as
`CodexProcess`'s does), reads one JSON object per line from the CLI's stdout:
- answers to our control requests resolve the request that waits for them;
- the CLI's own control requests run as tasks of their own (`can_use_tool` asks the permission port,
  which may wait minutes for the control plane) while the loop keeps reading, and a
  `control_cancel_request` cancels the one it names;
- every other message is parsed (claude_messages.py) and queued for the turn that reads them
  (`messages()`); the queue is bounded, so a CLI that writes faster than the driver admits waits.
A line that is not JSON, a known message with a wrong shape, or a line past `MAX_LINE_BYTES` is
reported (`provider.protocol`, bounded) and skipped: hostile output never ends the driver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec

from driver import logs
from driver.adapters.claude import control
from driver.adapters.claude import messages as wire
from driver.adapters.common.process import ProviderProcess
from driver.ports.permissions import MAX_OPEN_REQUESTS

log = logs.get(__name__)

# A tool result that quotes a large file makes a long line; beyond this the line is skipped, not kept.
MAX_LINE_BYTES = 32 * 1024 * 1024
QUEUE = 1000  # messages read ahead of the turn that takes them
INITIALIZE_TIMEOUT_S = 60.0  # the CLI starts its MCP servers before it answers
REQUEST_TIMEOUT_S = 60.0
# The CLI's permission prompts open at once: the permission port's one bound for every runtime
# (driver/ports/permissions.py). Refused here already, past it a prompt is answered with an error at
# once without even a task of its own.
MAX_OPEN_PERMISSIONS = MAX_OPEN_REQUESTS

OnPermission = Callable[[control.PermissionAsk], Awaitable[control.PermissionAnswer]]
OnProblem = Callable[[str], Awaitable[None]]


class ClientClosed(Exception):
    """The CLI's output ended (it exited, or was stopped) before an answer came."""


class StartFailed(Exception):
    """The CLI did not answer `initialize`: why, and the last of its stderr (redacted)."""

    def __init__(self, message: str, stderr_tail: str) -> None:
        super().__init__(message)
        self.stderr_tail = stderr_tail


class ClaudeClient:
    def __init__(self, proc: ProviderProcess, *, on_permission: OnPermission, on_problem: OnProblem) -> None:
        self.proc = proc
        self._on_permission = on_permission
        self._on_problem = on_problem
        self._send_queue, self._queue = anyio.create_memory_object_stream[wire.Message](QUEUE)
        self._pending: dict[str, asyncio.Future[control.Reply]] = {}
        self._handlers: dict[str, asyncio.Task[None]] = {}
        self._asks: dict[str, bool] = {}  # request_id → whether that open handler is a can_use_tool
        self._refusals: set[asyncio.Task[None]] = set()  # error answers being written (kept referenced)
        self._write_lock = anyio.Lock()
        self.closed = anyio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(), name="claude-read")

    @classmethod
    async def open(
        cls,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str | Path,
        initialize: dict[str, Any],
        on_permission: OnPermission,
        on_problem: OnProblem,
    ) -> tuple[ClaudeClient, dict[str, Any]]:
        """A started and initialized CLI, and its initialize answer. Raises `StartFailed` when it does
        not answer (a resume it refused, a bad flag: its stderr tail says why); ProviderError
        (`provider.missing`) when the binary or the cwd is not there."""
        proc = await ProviderProcess.spawn(argv, env=env, cwd=cwd, name="claude")
        client = cls(proc, on_permission=on_permission, on_problem=on_problem)
        try:
            answer = await client.request(control.initialize(initialize), timeout=INITIALIZE_TIMEOUT_S)
        except Exception as exc:
            with anyio.CancelScope(shield=True):
                await client.close(grace=1.0)
            tail = proc.stderr_tail()
            last = tail.strip().rsplit("\n", 1)[-1][:300] if tail.strip() else ""
            reason = str(exc) or type(exc).__name__
            raise StartFailed(f"{reason}: {last}" if last else reason, tail) from None
        except BaseException:
            with anyio.CancelScope(shield=True):
                await client.close(grace=1.0)
            raise
        return client, answer

    # -- writing ----------------------------------------------------------------------------------

    async def _write(self, frame: dict[str, Any]) -> None:
        line = msgspec.json.encode(frame) + b"\n"
        async with self._write_lock:
            try:
                await self.proc.stdin.send(line)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                raise ClientClosed("the Claude Code CLI's input is closed") from exc

    async def send(self, message: dict[str, Any]) -> None:
        """One message to the CLI (a user prompt)."""
        await self._write(message)

    async def request(self, body: dict[str, Any], *, timeout: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
        """A control request; its answer's body. Raises `ClientClosed`, TimeoutError, or RuntimeError
        with the CLI's error."""
        if self.closed.is_set():
            raise ClientClosed("the Claude Code CLI has stopped")
        request_id = control.new_request_id()
        future: asyncio.Future[control.Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._write(control.request(request_id, body))
            with anyio.fail_after(timeout):
                reply = await future
        finally:
            self._pending.pop(request_id, None)
        if reply.error is not None:
            raise RuntimeError(f"the Claude Code CLI refused {body.get('subtype')}: {reply.error}")
        return reply.response or {}

    async def interrupt(self) -> None:
        await self.request(control.INTERRUPT)

    # -- reading ----------------------------------------------------------------------------------

    async def messages(self) -> AsyncIterator[wire.Message]:
        """The CLI's messages as they come; ends when its output has ended and all were taken."""
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            while True:
                yield await self._queue.receive()

    async def _read_loop(self) -> None:
        buffer = bytearray()
        skipping = False  # inside a line past MAX_LINE_BYTES: dropped up to its end
        try:
            async for chunk in self.proc.stdout:
                start = 0
                while (end := chunk.find(b"\n", start)) != -1:
                    piece = chunk[start:end]
                    start = end + 1
                    if skipping:
                        skipping = False
                        continue
                    if buffer:
                        buffer += piece
                        piece, buffer = bytes(buffer), bytearray()
                    if len(piece) > MAX_LINE_BYTES:
                        await self._on_problem(f"a line over {MAX_LINE_BYTES} bytes")
                        continue
                    await self._line(piece)
                if not skipping:
                    buffer += chunk[start:]
                    if len(buffer) > MAX_LINE_BYTES:
                        buffer, skipping = bytearray(), True
                        await self._on_problem(f"a line over {MAX_LINE_BYTES} bytes")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        except Exception as exc:  # a bug of ours must end this CLI's link, never the driver
            log.error("claude.read_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self.closed.set()
            self._send_queue.close()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ClientClosed("the Claude Code CLI stopped before it answered"))
            for task in [*self._handlers.values(), *self._refusals]:
                task.cancel()

    async def _line(self, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            await self._on_problem("a line that is not JSON")
            return
        except RecursionError:  # nested ~1000 levels deep (a tool input is the model's to shape)
            await self._on_problem("a line nested too deep to decode")
            return
        if not isinstance(data, dict):
            await self._on_problem("a JSON value that is not an object")
            return
        kind = data.get("type")
        try:
            if kind == "control_response":
                reply = control.reply_of(data)
                future = self._pending.get(reply.request_id)
                if future is not None and not future.done():
                    future.set_result(reply)
                return
            if kind == "control_request":
                self._start_handler(data)
                return
            if kind == "control_cancel_request":
                # The CLI gave up on it: it expects no answer, and it no longer counts as open.
                withdrawn = str(data.get("request_id"))
                task = self._handlers.pop(withdrawn, None)
                self._asks.pop(withdrawn, None)
                if task is not None:
                    task.cancel()
                return
            message = wire.parse(data)
        except (control.BadControl, wire.BadMessage) as exc:
            await self._on_problem(str(exc))
            return
        if message is not None:
            await self._send_queue.send(message)

    # -- the CLI's requests -------------------------------------------------------------------------

    def _start_handler(self, frame: dict[str, Any]) -> None:
        request_id, body = frame.get("request_id"), frame.get("request")
        if not isinstance(request_id, str) or not isinstance(body, dict):
            raise control.BadControl("control_request without a request_id and a request object")
        refusal: str | None = None
        if request_id in self._handlers:
            # A second handler under the same id would take the first's entry (and its cleanup remove
            # the second's), so a control_cancel_request could no longer reach the one left open.
            refusal = f"control request {request_id!r} is already open"
        elif body.get("subtype") == "can_use_tool" and self._open_permissions() >= MAX_OPEN_PERMISSIONS:
            refusal = f"too many permission requests open (limit {MAX_OPEN_PERMISSIONS}); answer or cancel some first"
        if refusal is not None:
            log.warning("claude.control_refused", subtype=body.get("subtype"), reason=refusal)
            task = asyncio.get_running_loop().create_task(
                self._refuse(request_id, refusal), name="claude-control-refused"
            )
            self._refusals.add(task)
            task.add_done_callback(self._refusals.discard)
            return
        task = asyncio.get_running_loop().create_task(self._answer(request_id, body), name="claude-control")
        self._handlers[request_id] = task
        self._asks[request_id] = body.get("subtype") == "can_use_tool"

        def forget(done: asyncio.Task[None]) -> None:
            if self._handlers.get(request_id) is done:  # only its own entry, never a later one's
                del self._handlers[request_id]
                self._asks.pop(request_id, None)

        task.add_done_callback(forget)

    def _open_permissions(self) -> int:
        return sum(1 for ask in self._asks.values() if ask)

    async def _refuse(self, request_id: str, message: str) -> None:
        with contextlib.suppress(ClientClosed):
            await self._write(control.error(request_id, message))

    async def _answer(self, request_id: str, body: dict[str, Any]) -> None:
        subtype = body.get("subtype")
        try:
            if subtype == "can_use_tool":
                ask = control.permission_ask(body)
                answer = await self._on_permission(ask)
                frame = control.success(request_id, control.permission_response(answer, ask.tool_input))
            else:
                # No hooks and no in-process MCP servers are registered: nothing else is ours to answer.
                frame = control.error(request_id, f"unsupported control request: {subtype}")
        except asyncio.CancelledError:
            raise  # withdrawn by the CLI, or the CLI is gone: no answer
        except Exception as exc:  # a permission port failure: the call is refused, the CLI goes on
            log.warning("claude.control_failed", subtype=subtype, error=f"{type(exc).__name__}: {exc}")
            frame = control.error(request_id, f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(ClientClosed):
            await self._write(frame)

    # -- the end ------------------------------------------------------------------------------------

    async def close(self, *, grace: float = 3.0) -> None:
        """End the CLI (stdin closed, then TERM, then KILL after `grace`) and the read loop. Shielded."""
        with anyio.CancelScope(shield=True):
            await self.proc.terminate(grace=grace)
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
