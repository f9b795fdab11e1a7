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
import functools
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec

from driver import guard, logs, tasks
from driver.adapters.acp import models as m
from driver.adapters.acp import reattach as acp_reattach
from driver.adapters.acp import state as acp_state
from driver.adapters.acp.terminal import TerminalManager, TerminalStreams
from driver.adapters.acp.turn import FILE_TOUCHED, AcpTurn, Emit
from driver.adapters.common import changed_files, host_server
from driver.adapters.common.base import Adapter, AdapterConfig, PathNotAllowed, Ports, ProviderError
from driver.adapters.common.jsonrpc import JsonRpcError, JsonRpcPeer, PeerClosed, RequestId
from driver.adapters.common.keeping import AnyProcess, provider_process
from driver.adapters.common.protocol_diagnostics import ProtocolDiagnostics
from driver.keeper.kept import KeptProcess
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
        self._proc: AnyProcess | None = None
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
        self._agent_raw: Any = None  # the `initialize` answer as sent, for a reattached successor
        self._argv_used: list[str] = []
        # PROTOCOL §8.2: what this process continues from a dead predecessor (None: it started the agent).
        self._continuing: acp_reattach.Continuation | None = None
        self._state_skip = 0  # state snapshots re-derived in a replay that the predecessor reported
        self._state_sent = 0  # state snapshots reported since the last mark (any driver process's)
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
        proc = self._proc
        groups: list[int] = []
        if isinstance(proc, KeptProcess) and not proc.exited.is_set():
            groups = proc.group_ids()  # the keeper's namespace too: every process of the agent's tree
        elif proc is not None and not proc.exited.is_set():
            groups = [proc.pgid]
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
        name = f"acp:{Path(argv[0]).name}"
        self._argv_used = argv
        # Under a keeper when reattach is on (PROTOCOL §8.2), or a dead predecessor's agent, attached.
        spawn = functools.partial(provider_process, argv, env=env, cwd=self._cwd, name=name, config=self.config)
        proc, plan = await spawn(runtime="acp")
        self._proc = proc
        cont = None
        if plan is not None:
            cont = await anyio.to_thread.run_sync(acp_reattach.load, plan)
            if cont is None or cont.argv != argv:
                # Not this configuration's agent (or no session to continue): end it, start afresh;
                # the run it had in flight ends driver.restarted (`resume` finds nothing to continue).
                log.warning("acp.reattach_refused", reason="no session" if cont is None else "another agent command")
                cont = None
                await proc.terminate(grace=self.stop_grace)
                proc, _ = await spawn(runtime="acp")  # the plan is taken: a fresh keeper
                self._proc = proc
                plan = None
        if self.config.execution.host_tools:
            # The `host` MCP server: loopback HTTP, bearer token passed in the session's MCP headers. A
            # reattached agent's open session keeps calling the dead driver's address with its token:
            # they are served again (driver/adapters/common/host_server.py).
            self._host = await host_server.start(self.config, self.ports.host_tools)
        if plan is None and isinstance(proc, KeptProcess):
            host_server.remember(Path(self.config.session.state_dir), self._host)
        self._peer = JsonRpcPeer(
            proc.stdout,
            proc.stdin,
            name=name,
            jsonrpc_version="2.0",
            on_request=self._on_request,
            on_notification=self._on_notification,
            on_violation=ProtocolDiagnostics(self.ports.emit, "the acp agent"),
            on_handler_error=guard.PortErrors(self.ports.emit, "the acp agent"),
            first_id=plan.first_id if plan is not None else 0,
            answered=plan.answered if plan is not None else frozenset(),
            on_replayed=self._on_replayed if plan is not None else None,
        )
        if cont is not None:
            self._continue(cont)  # before the peer reads: the adopted answers may be in the log already
        self._peer_task = asyncio.get_running_loop().create_task(self._peer.run(), name=f"{name}-rpc")
        # The dead driver's terminals ended with it (contained like a provider, recorded for the next
        # driver's sweep): a reattached one's ids are new, so an old id is unknown, never another's.
        prefix = f"term-r{secrets.token_hex(3)}-" if cont is not None else "term-"
        self._terminals = TerminalManager(
            env=env, default_cwd=self._cwd, on_output=self._terminal_streams.output, id_prefix=prefix
        )
        if cont is not None:
            log.info("acp.reattached", session_id=cont.session_id, run_id=cont.run_id, prompts=len(cont.prompt_ids))
            await self.ports.emit("runtime.resume.updated", {"runtime": self.runtime, "value": cont.session_id})
            return
        try:
            with anyio.fail_after(self.start_timeout):
                await self._open_session()
            self._mark(None)
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

    def _continue(self, cont: acp_reattach.Continuation) -> None:
        """Take over a predecessor's initialized agent and open session (and its run in flight)."""
        self._continuing = cont
        self.agent, self._agent_raw = cont.agent, cont.agent_raw
        self._session_id = cont.session_id
        self._state = cont.state
        self._cost_total = cont.cost_before
        self._state_skip = self._state_sent = cont.state_sent
        self._instructions_pending, self._recovery_pending = cont.instructions, cont.recovery

    def _mark(self, run_id: str | None) -> None:
        """Tell a keeper's successor which run is in flight, where its turn's output starts, and what
        it needs of this session (driver/adapters/acp/reattach.py). Written before `session/prompt`."""
        if isinstance(self._proc, KeptProcess) and self._session_id is not None:
            self._state_sent = self._state_skip = 0
            facts = acp_reattach.facts(
                self._argv_used,
                self._agent_raw,
                self._cost_total,
                self._state,
                self._instructions_pending,
                self._recovery_pending,
            )
            self._proc.mark_turn(run_id, self._session_id, facts)

    async def _emit_state(self, events: list[acp_state.Emit]) -> None:
        """Session state snapshots from the agent's updates. After a reattach, the first ones re-derived
        from output the predecessor read were reported by it: they are not reported twice (the
        snapshots are not run events, so the kernel's replay gate does not see them)."""
        for kind, payload in events:
            if self._state_skip > 0:
                self._state_skip -= 1
                continue
            await self.ports.emit(kind, payload)
            if isinstance(self._proc, KeptProcess):
                # After the emit (journaled): a crash in between reports it twice, never not at all.
                self._state_sent += 1
                self._proc.update_turn({"state": self._state.export(), "state_sent": self._state_sent})

    @abc.abstractmethod
    async def _on_replayed(self, request_id: RequestId, method: str, params: Any) -> None:
        """A request of the agent's that a predecessor answered, met again in the re-read output."""

    def detach(self) -> bool:
        proc = self._proc
        if not isinstance(proc, KeptProcess):
            return False
        # Freeze, do not close: a closed stream would end the run in flight as a crash. What the keeper
        # logs from now on is the successor's to read.
        proc.detach()
        return True

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
        digest = await anyio.to_thread.run_sync(changed_files.sha256_of, admitted)
        gone = digest is None and not os.path.lexists(admitted)  # None also for a file too large to hash
        change = "deleted" if gone else ("created" if created else "modified")
        await self._file_changed(admitted, change, digest)

    async def _file_changed(self, path: Path, change: str, digest: str | None) -> None:
        # One report per file state and turn: an agent may write through fs/* *and* show a diff.
        key = (str(path), digest)
        if key in self._reported_files:
            return
        self._reported_files.add(key)
        payload = {"path": changed_files.relative_to_cwd(path, self._cwd), "change": change, "sha256": digest}
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

    async def _call(
        self,
        method: str,
        params: dict[str, Any],
        on_sent: Callable[[], None] | None = None,
        on_answer: Callable[[Any], None] | None = None,
    ) -> Any:
        """A request to the agent that fails with `provider.crashed` if the agent dies first.

        Races the answer against the process exit: an agent whose stdout stays open (held by a
        grandchild) after it died would otherwise leave us waiting forever.
        """
        peer, proc = self._peer, self._proc
        if peer is None or proc is None:
            raise ProviderError("provider.not_started", "the acp agent is not running")
        answer: dict[str, Any] = {}
        async with tasks.within("acp request") as tg:

            async def ask() -> None:
                try:
                    answer["result"] = await peer.request(method, params, on_sent=on_sent, on_answer=on_answer)
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

            tg.spawn(ask)
            tg.spawn(watch)
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
