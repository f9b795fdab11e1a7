"""The Codex app-server process and its JSON-RPC peer, for the adapter (driver/adapters/codex/adapter.py).

`open()` spawns the process (directly, under a keeper, or continues a predecessor's: PROTOCOL §8.2,
driver/adapters/common/keeping.py) and starts the peer's read loop as a task on the event loop for the life of
the process (as `ProviderProcess` does for its stderr), because the process outlives every single
adapter call. Requests fail `provider.crashed` when Codex dies before answering. The adapter holds one
`CodexProcess` per adapter; what is said over the peer (threads, turns) is the adapter's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio

from driver import guard, tasks
from driver.adapters.common.base import AdapterConfig, ProviderError
from driver.adapters.common.jsonrpc import JsonRpcPeer, PeerClosed
from driver.adapters.common.keeping import AnyProcess, provider_process
from driver.adapters.common.protocol_diagnostics import Emit, ProtocolDiagnostics
from driver.keeper import reattach
from driver.keeper.kept import KeptProcess
from driver.ports.mcp_host import McpHostServer

Handler = Callable[[str, Any], Awaitable[Any]]

# How long a crash report waits for the exit status, and a turn for the last lines after the exit.
EXIT_WAIT_S = 2.0


class CodexProcess:
    def __init__(self, *, stop_grace: float) -> None:
        self.stop_grace = stop_grace
        self.proc: AnyProcess | None = None
        self.peer: JsonRpcPeer | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = anyio.Event()

    async def open(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        config: AdapterConfig,
        runtime: str,
        emit: Emit,
        on_request: Handler,
        on_notification: Handler,
        host: McpHostServer | None = None,
    ) -> reattach.Plan | None:
        """Spawn (or continue) the process and start its peer; the reattach plan when it is a
        predecessor's Codex (initialized already: no handshake)."""
        proc, plan = await provider_process(
            argv, env=env, cwd=cwd, name="codex", config=config, runtime=runtime, host=host
        )
        self._set_proc(proc)
        peer = JsonRpcPeer(
            proc.stdout,
            proc.stdin,
            name="codex",
            jsonrpc_version=None,
            on_request=on_request,
            on_notification=on_notification,
            on_violation=ProtocolDiagnostics(emit, "codex app-server"),
            on_handler_error=guard.PortErrors(emit, "codex app-server"),
            first_id=plan.first_id if plan is not None else 0,
            answered=plan.answered if plan is not None else frozenset(),
        )
        self.peer = peer
        self._task = asyncio.get_running_loop().create_task(peer.run(), name="codex-rpc")
        return plan

    def _set_proc(self, proc: AnyProcess | None) -> None:
        self.proc = proc
        self._changed.set()
        self._changed = anyio.Event()

    async def call(self, method: str, params: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
        """A request that fails with `provider.crashed` if Codex dies before answering."""
        peer, proc = self.peer, self.proc
        if peer is None or proc is None:
            raise ProviderError("provider.not_started", "codex is not running")
        try:
            return await peer.request(method, params, extra=extra)
        except PeerClosed:
            raise await self.crashed(f"codex exited during {method}") from None

    async def notify(self, method: str) -> None:
        peer = self.peer
        if peer is None:
            raise ProviderError("provider.not_started", "codex is not running")
        await peer.notify(method)

    async def crashed(self, message: str) -> ProviderError:
        proc = self.proc
        code: int | None = None
        tail = ""
        if proc is not None:
            with anyio.move_on_after(EXIT_WAIT_S):
                code = await proc.wait()
            tail = proc.stderr_tail()
        suffix = f" (status {code})" if code is not None else ""
        last_line = tail.strip().rsplit("\n", 1)[-1] if tail.strip() else ""
        if last_line:
            suffix += f": {last_line[:300]}"
        return ProviderError(
            "provider.crashed", message + suffix, retryable=True, details={"stderr_tail": tail, "exit_code": code}
        )

    def group_ids(self) -> list[int]:
        proc = self.proc
        if isinstance(proc, KeptProcess) and proc.returncode is None:
            return proc.group_ids()
        return [proc.pgid] if proc is not None and proc.returncode is None else []

    def mark(self, run_id: str | None, thread_id: str | None) -> None:
        """Tell a keeper's successor which run is in flight and where its turn's output starts."""
        if isinstance(self.proc, KeptProcess) and thread_id is not None:
            self.proc.mark_turn(run_id, thread_id)

    async def wait_exited(self) -> None:
        # Watch whichever process is current: stop() clears `proc` before terminating it, so an exit
        # we caused ourselves is never reported as Codex dying on its own.
        while True:
            proc = self.proc
            if proc is None:
                await self._changed.wait()
                continue
            await proc.exited.wait()
            if self.proc is proc:
                return

    def stderr_tail(self) -> str:
        return self.proc.stderr_tail() if self.proc is not None else ""

    def detach(self) -> bool:
        proc = self.proc
        if not isinstance(proc, KeptProcess):
            return False
        # Freeze, do not close: a closed stream would end the run in flight as a crash. What the keeper
        # logs from now on is the successor's to read.
        proc.detach()
        return True

    async def stop(self, *, then: Callable[[], Awaitable[None]] | None = None) -> None:
        """End the process, then `then` (the adapter's own clean-up), then the peer's read loop."""
        proc = self.proc
        self._set_proc(None)
        task, self._task = self._task, None
        self.peer = None
        with anyio.CancelScope(shield=True):
            if proc is not None:
                await proc.terminate(grace=self.stop_grace)
            if then is not None:
                await then()
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task


async def watch_exit(peer: JsonRpcPeer, proc: AnyProcess, ended: anyio.Event) -> None:
    """Set `ended` when Codex goes away: its stdout closes, or it exits (then give the reader a moment
    to take the last lines, in case a grandchild keeps stdout open)."""
    async with tasks.within("codex exit watch") as tg:

        async def closed() -> None:
            await peer.closed.wait()
            tg.cancel_scope.cancel()

        async def exited() -> None:
            await proc.exited.wait()
            with anyio.move_on_after(EXIT_WAIT_S):
                await peer.closed.wait()
            tg.cancel_scope.cancel()

        tg.spawn(closed)
        tg.spawn(exited)
    ended.set()
