"""The ACP client's plumbing: the agent process, its JSON-RPC peer, and the calls and events through them.

`AcpClient` owns what every part of the `acp` adapter shares: the agent process (spawned with the
pinned Node first on PATH) and its JSON-RPC 2.0 peer, the start/stop lifecycle, requests that fail
with `provider.crashed` when the agent dies first, answer decoding, and the file reports that
events from both turns and fs/* calls end in. What to say over it lives in the subclasses:
`acp_opening.AcpSessionOpener` (initialize, auth, session/new or session/load) and
`acp.AcpAdapter` (turns and the agent's callbacks).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec

from driver import guard, logs
from driver.adapters import acp_fs, acp_state
from driver.adapters import acp_models as m
from driver.adapters.acp_terminal import TerminalManager, TerminalStreams
from driver.adapters.acp_turn import FILE_TOUCHED, AcpTurn, Emit
from driver.adapters.base import Adapter, AdapterConfig, PathNotAllowed, Ports, ProviderError
from driver.adapters.jsonrpc import JsonRpcError, JsonRpcPeer, PeerClosed
from driver.adapters.process import ProviderProcess
from driver.adapters.protocol_diagnostics import ProtocolDiagnostics
from driver.ports.mcp_host import McpHostServer

log = logs.get(__name__)
T = TypeVar("T")

REFUSED = object()  # what _try_call returns for a refused request


class AcpClient(Adapter):
    # Seconds for the agent to answer initialize / session setup (a Node agent cold-starts in ~2 s).
    start_timeout: float = 60.0
    # Seconds between SIGTERM and SIGKILL in stop().
    stop_grace: float = 3.0

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        super().__init__(config, ports)
        self._proc: ProviderProcess | None = None
        self._peer: JsonRpcPeer | None = None
        self._peer_task: asyncio.Task[None] | None = None
        self._terminals: TerminalManager | None = None
        self._host: McpHostServer | None = None
        self._setup_warnings: list[str] = []
        self._warned: set[str] = set()
        self._session_id: str | None = None
        self._state = acp_state.SessionState()
        # Terminal output as tool output; the current turn says which tool call shows which terminal.
        self._terminal_streams = TerminalStreams(lambda: self._turn, self.ports)
        self._cost_total = 0.0  # the session's cumulative cost (ACP usage_update) after the last turn
        self.agent: m.InitializeResult | None = None
        self._turn: AcpTurn | None = None
        self._cancel_requested = False
        self._cancel_event = anyio.Event()
        self._reported_files: set[tuple[str, str | None]] = set()
        self._permission_scopes: set[anyio.CancelScope] = set()
        self._recovery_pending: list[tuple[str, str]] = []
        # Instructions for an agent that takes no system prompt: sent ahead of a new session's first prompt.
        self._instructions_pending = ""
        self._cwd = Path(config.session.cwd).resolve()
        # Counts of session/update variants we did not understand, for diagnostics.
        self.unknown_updates: dict[str, int] = {}

    # ---- lifecycle --------------------------------------------------------------------------

    @property
    def native_id(self) -> str | None:
        return self._session_id

    def process_group_ids(self) -> list[int]:
        groups = [self._proc.pgid] if self._proc is not None and not self._proc.exited.is_set() else []
        if self._terminals is not None:
            groups.extend(self._terminals.process_group_ids())
        return groups

    async def wait_exited(self) -> None:
        # Watch whichever agent process is current: stop() clears `_proc` before terminating it, so
        # an exit we caused ourselves is never reported as the agent dying on its own.
        while True:
            proc = self._proc
            if proc is None:
                await anyio.sleep(0.2)
                continue
            await proc.exited.wait()
            if self._proc is proc:
                return

    def stderr_tail(self) -> str:
        return self._proc.stderr_tail() if self._proc is not None else ""

    def _env(self) -> dict[str, str]:
        acp = self.config.execution.acp
        env = {**self.config.env, **(acp.env if acp else {})}
        # The pinned runtimes' bin dir (with the pinned `node`) goes first, so an agent script's
        # `#!/usr/bin/env node`, and any node it starts, runs on the Node whose version was checked
        # against its `engines`, not on whatever Node the machine has.
        pinned = self.config.project_root / "node_modules" / ".bin"
        if pinned.is_dir():
            env["PATH"] = os.pathsep.join([str(pinned), env.get("PATH", os.defpath)])
        return env

    def _argv(self, env: dict[str, str]) -> list[str]:
        acp = self.config.execution.acp
        if acp is None:
            raise ProviderError("provider.config", "execution.acp.command is required for the acp runtime")
        argv = list(acp.command)
        exe = argv[0]
        if "/" in exe:
            # A relative path is relative to the project (where node_modules lives), not to cwd.
            argv[0] = str(Path(exe) if os.path.isabs(exe) else self.config.project_root / exe)
        else:
            found = shutil.which(exe, path=env.get("PATH", os.defpath))
            if found is None:
                raise ProviderError("provider.missing", f"acp agent executable not found: {exe}")
            argv[0] = found
        return argv

    async def start(self) -> None:
        env = self._env()
        argv = self._argv(env)
        if self.config.execution.host_tools:
            # The `host` MCP server: loopback HTTP, bearer token passed in the session's MCP headers.
            self._host = McpHostServer(self.config.execution.host_tools, self.ports.host_tools)
            await self._host.start()
        proc = await ProviderProcess.spawn(argv, env=env, cwd=self._cwd, name=f"acp:{Path(argv[0]).name}")
        self._proc = proc
        self._peer = JsonRpcPeer(
            proc.stdout,
            proc.stdin,
            name=proc.name,
            jsonrpc_version="2.0",
            on_request=self._on_request,
            on_notification=self._on_notification,
            on_violation=ProtocolDiagnostics(self.ports.emit, "the acp agent"),
            on_handler_error=guard.PortErrors(self.ports.emit, "the acp agent"),
        )
        self._peer_task = asyncio.get_running_loop().create_task(self._peer.run(), name=f"{proc.name}-rpc")
        self._terminals = TerminalManager(env=env, default_cwd=self._cwd, on_output=self._terminal_streams.output)
        try:
            with anyio.fail_after(self.start_timeout):
                await self._open_session()
        except TimeoutError:
            await self.stop()
            raise ProviderError(
                "provider.start_timeout",
                f"acp agent did not finish starting within {self.start_timeout:g} s",
                retryable=True,
                details={"stderr_tail": proc.stderr_tail()},
            ) from None
        except BaseException:
            # A half-started agent is of no use to anyone: do not leave it running.
            await self.stop()
            raise

    @abc.abstractmethod
    async def _open_session(self) -> None:
        """initialize, then open (or load) the session: run by start() once the peer is up."""

    @abc.abstractmethod
    async def _on_notification(self, method: str, params: Any) -> None:
        """A notification from the agent."""

    @abc.abstractmethod
    async def _on_request(self, method: str, params: Any) -> Any:
        """A request from the agent; returns the answer or raises JsonRpcError."""

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        terminals, self._terminals = self._terminals, None
        task, self._peer_task = self._peer_task, None
        host, self._host = self._host, None
        self._peer = None
        for scope in list(self._permission_scopes):
            scope.cancel()
        with anyio.CancelScope(shield=True):
            if terminals is not None:
                await terminals.close()
            if proc is not None:
                # codex-acp does not exit on stdin EOF: terminate() closes stdin, SIGTERMs, then SIGKILLs.
                await proc.terminate(grace=self.stop_grace)
            if host is not None:
                await host.close()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ---- plumbing ---------------------------------------------------------------------------

    async def _emit_all(self, events: list[Emit]) -> None:
        for kind, payload in events:
            if kind == FILE_TOUCHED:
                await self._file_touched(payload["path"], payload["created"])
            else:
                await self.ports.emit(kind, payload)

    async def _file_touched(self, path: str, created: bool) -> None:
        """A tool edited a file natively: report it like an fs/write_text_file, if it is ours to see."""
        try:
            admitted = self.ports.files.admit(path)
        except PathNotAllowed:
            log.info("acp.file_outside_roots", path=path)
            return
        digest = await anyio.to_thread.run_sync(acp_fs.sha256_of, admitted)
        change = "deleted" if digest is None else ("created" if created else "modified")
        await self._file_changed(admitted, change, digest)

    async def _file_changed(self, path: Path, change: str, digest: str | None) -> None:
        # One report per file state and turn: an agent may write through fs/* *and* show a diff.
        key = (str(path), digest)
        if key in self._reported_files:
            return
        self._reported_files.add(key)
        payload = {"path": acp_fs.relative_to_cwd(path, self._cwd), "change": change, "sha256": digest}
        await self.ports.emit("file.changed", payload)

    @staticmethod
    def _decode_params(params: Any, type_: type[T]) -> T:
        try:
            return m.decode(params, type_)
        except msgspec.ValidationError as exc:
            raise JsonRpcError(m.INVALID_PARAMS, f"invalid params: {exc}") from None

    def _decode(self, raw: Any, type_: type[T], method: str) -> T:
        try:
            return m.decode(raw, type_)
        except msgspec.ValidationError as exc:
            raise ProviderError("provider.protocol", f"unexpected {method} answer from the agent: {exc}") from None

    async def _try_call(self, method: str, params: dict[str, Any]) -> Any:
        """A best-effort setting: a refusal is logged, never fatal. Returns the answer, or REFUSED."""
        try:
            return await self._call(method, params)
        except JsonRpcError as exc:
            log.warning("acp.call_refused", method=method, code=exc.code, error=exc.message)
            return REFUSED

    async def _call(self, method: str, params: dict[str, Any], on_sent: Callable[[], None] | None = None) -> Any:
        """A request to the agent that fails with `provider.crashed` if the agent dies first.

        Races the answer against the process exit: an agent whose stdout stays open (held by a
        grandchild) after it died would otherwise leave us waiting forever.
        """
        peer, proc = self._peer, self._proc
        if peer is None or proc is None:
            raise ProviderError("provider.not_started", "the acp agent is not running")
        answer: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                try:
                    answer["result"] = await peer.request(method, params, on_sent=on_sent)
                except (JsonRpcError, PeerClosed) as exc:
                    answer["error"] = exc
                tg.cancel_scope.cancel()

            async def watch() -> None:
                await proc.exited.wait()
                # Let the last lines (perhaps the answer itself) be read before giving up.
                with anyio.move_on_after(2.0):
                    await peer.closed.wait()
                answer.setdefault("error", PeerClosed("agent exited"))
                tg.cancel_scope.cancel()

            tg.start_soon(ask)
            tg.start_soon(watch)
        error = answer.get("error")
        if isinstance(error, JsonRpcError):
            raise error
        if isinstance(error, PeerClosed):
            code = None
            with anyio.move_on_after(2.0):
                code = await proc.wait()
            raise ProviderError(
                "provider.crashed",
                f"the acp agent exited during {method}" + (f" (status {code})" if code is not None else ""),
                retryable=True,
                details={"stderr_tail": proc.stderr_tail(), "exit_code": code, "method": method},
            )
        return answer.get("result")
