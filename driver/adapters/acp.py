"""The `acp` runtime: we are the Agent Client Protocol client of an agent process.

The agent is `execution.acp.command` (argv) with `execution.acp.env` on top of the provider
environment. We speak ACP v1 (JSON-RPC 2.0, one JSON object per line) over its stdin/stdout:
`initialize` → (`authenticate` when asked) → `session/new` or `session/load` → one `session/prompt`
per run, streaming `session/update` notifications that `AcpTurn` maps onto our events.

The agent calls us back for permissions, files and terminals; each incoming request runs in its own
task (the JSON-RPC peer does that), so a permission waiting for a human never stalls the stream.

Permission policy. ACP has no standard "never ask" switch; agents expose session modes instead. We
pick a mode by well-known id (see acp_session.wanted_mode; `provider_options.mode` overrides). If a
`full_access` agent asks anyway, we allow by option kind without bothering the control plane.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio
import msgspec
import structlog

from driver.adapters import acp_fs, acp_permissions, acp_session, acp_state, attachments
from driver.adapters import acp_models as m
from driver.adapters.acp_terminal import TerminalError, TerminalManager, TerminalStreams
from driver.adapters.acp_turn import FILE_TOUCHED, AcpTurn, Emit
from driver.adapters.base import (
    Adapter,
    AdapterConfig,
    PathNotAllowed,
    PermissionDecision,
    Ports,
    ProviderError,
    TurnOutcome,
)
from driver.adapters.jsonrpc import JsonRpcError, JsonRpcPeer, PeerClosed
from driver.adapters.process import ProviderProcess
from driver.adapters.protocol_diagnostics import ProtocolDiagnostics
from driver.adapters.registry import CAPABILITIES
from driver.ports.mcp_host import McpHostServer
from driver.protocol.commands import RunInput
from driver.telemetry import tracing

log = structlog.get_logger(__name__)
T = TypeVar("T")

FAILED_STOP_REASONS: frozenset[str] = frozenset({"max_tokens", "max_turn_requests", "refusal"})
CANCEL_RESENDS = 3
CANCEL_RESEND_INTERVAL = 1.0  # seconds; the kernel escalates to signals after 5 s
_REFUSED = object()  # what _try_call returns for a refused request


class AcpAdapter(Adapter):
    runtime: ClassVar[str] = "acp"
    # Declared once, in the registry, so `hello` can state them without importing this module.
    capabilities: ClassVar[frozenset[str]] = CAPABILITIES["acp"]
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

    async def _open_session(self) -> None:
        init = await self._call(
            "initialize",
            {
                "protocolVersion": m.PROTOCOL_VERSION,
                "clientCapabilities": {"fs": {"readTextFile": True, "writeTextFile": True}, "terminal": True},
                "clientInfo": {"name": "agent-driver", "version": "0.1.0"},
            },
        )
        self.agent = self._decode(init, m.InitializeResult, "initialize")
        if self.agent.protocol_version != m.PROTOCOL_VERSION:
            # The agent answered with the version it speaks; we support only ours (ACP v1).
            raise ProviderError(
                "provider.protocol",
                f"the acp agent speaks protocol version {self.agent.protocol_version}, not {m.PROTOCOL_VERSION}",
            )
        if self._host is not None and not self.agent.agent_capabilities.mcp_capabilities.http:
            await self._config_warning("the acp agent takes no MCP server over http: host_tools are not offered")
        resume = self.config.execution.native_resume
        if resume is not None:
            # A resume id of another runtime (the execution changed runtime) cannot be loaded either.
            loadable = resume.runtime == self.runtime and self.agent.agent_capabilities.load_session
            if loadable and await self._load_session(resume.value):
                return
            current = await self._new_session()
            log.info("acp.session_reset", previous=resume.value, current=current)
            self._recovery_pending = [(r.role, r.text) for r in self.config.execution.recovery_messages]
            await self.ports.emit("runtime.session.reset", {"previous": resume.value, "current": current})
        else:
            await self._new_session()
            # No session to load but a history to keep (PROTOCOL §8): replayed on the next turn.
            self._recovery_pending = [(r.role, r.text) for r in self.config.execution.recovery_messages]

    async def _config_warning(self, message: str) -> None:
        log.warning("acp.config", message=message)
        await self.ports.emit(
            "diagnostic.reported", {"code": "provider.config", "severity": "warning", "message": message}
        )

    def _session_params(self) -> dict[str, Any]:
        assert self.agent is not None
        host = acp_session.HostServer(self._host.url, self._host.token) if self._host is not None else None
        execution = self.config.execution
        return acp_session.session_params(
            self._cwd, self.config.session, execution, self.agent, host, self._setup_warnings
        )

    async def _report_setup_warnings(self) -> None:
        warnings, self._setup_warnings = self._setup_warnings, []
        for warning in dict.fromkeys(warnings):
            if warning not in self._warned:
                self._warned.add(warning)
                await self._config_warning(warning)

    async def _new_session(self) -> str:
        params = self._session_params()
        try:
            raw = await self._call("session/new", params)
        except JsonRpcError as exc:
            if exc.code != m.AUTH_REQUIRED:
                raise ProviderError("provider.start_failed", f"session/new failed: {exc.message}") from None
            await self._authenticate()
            raw = await self._call("session/new", params)
        result = self._decode(raw, m.NewSessionResult, "session/new")
        if "systemPrompt" not in params:
            self._instructions_pending = acp_session.instruction_text(
                self._cwd, self.config.session, self.config.execution
            )
        await self._session_opened(result.session_id, result.modes, result.config_options, raw)
        await self._report_setup_warnings()
        return result.session_id

    async def _load_session(self, session_id: str) -> bool:
        # Updates replaying the history arrive before the answer; with no turn active they are dropped.
        try:
            raw = await self._call("session/load", {**self._session_params(), "sessionId": session_id})
        except JsonRpcError as exc:
            log.info("acp.load_failed", session_id=session_id, code=exc.code, error=exc.message)
            return False
        result = self._decode(raw or {}, m.LoadSessionResult, "session/load")
        await self._session_opened(session_id, result.modes, result.config_options, raw)
        await self._report_setup_warnings()
        return True

    async def _session_opened(
        self, session_id: str, modes: m.SessionModeState | None, config_options: list[m.ConfigOption], raw: Any
    ) -> None:
        self._session_id = session_id
        self._state = acp_state.SessionState()
        self._cost_total = 0.0
        await self.ports.emit("runtime.resume.updated", {"runtime": self.runtime, "value": session_id})
        await self._emit_all(self._state.opened(raw))
        await self._apply_mode(modes)
        await self._apply_model(config_options)
        options = self.config.execution.provider_options.get("config_options") or {}
        for config_id, value in dict(options).items():
            await self._set_config(config_id, value)

    async def _set_config(self, config_id: str, value: Any) -> None:
        assert self._session_id is not None
        answer = await self._try_call(
            "session/set_config_option", acp_state.set_config_params(self._session_id, config_id, value)
        )
        await self._emit_all(self._state.config(answer))

    async def _apply_model(self, config_options: list[m.ConfigOption]) -> None:
        choice = acp_session.model_choice(self.config.execution.model, config_options)
        if choice is None:
            if self.config.execution.model:
                log.info("acp.model_not_selectable", model=self.config.execution.model)
            return
        await self._set_config(*choice)

    async def _apply_mode(self, modes: m.SessionModeState | None) -> None:
        wanted = acp_session.wanted_mode(self.config.execution, modes)
        if wanted is not None:
            answer = await self._try_call("session/set_mode", {"sessionId": self._session_id, "modeId": wanted})
            if answer is not _REFUSED:
                await self._emit_all(self._state.mode_set(wanted))

    async def _authenticate(self) -> None:
        assert self.agent is not None
        method = acp_session.env_auth_method(self.agent, self._env())
        if method is None:
            hint = acp_session.auth_hint(self.agent)
            raise ProviderError("provider.auth_required", f"the acp agent requires authentication: {hint}")
        try:
            await self._call("authenticate", {"methodId": method.id})
        except JsonRpcError as exc:
            raise ProviderError(
                "provider.auth_failed", f"authenticate with {method.id!r} failed: {exc.message}"
            ) from None

    async def reset(self) -> tuple[str | None, str | None]:
        previous = self._session_id
        current = await self._new_session()
        self._recovery_pending = []  # the discarded conversation is not replayed into the new one
        return previous, current

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

    # ---- one turn ---------------------------------------------------------------------------

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        if self._session_id is None or self._peer is None:
            raise ProviderError("provider.not_started", "the acp agent has no open session")
        if self._turn is not None:
            raise ProviderError("driver.run_active", "a turn is already running", retryable=True)
        prompt = self._prompt_blocks(run_input)  # first: an attachment it refuses changes nothing
        turn = AcpTurn(run_id, self._cost_total)
        self._turn = turn
        self._cancel_requested = False
        self._cancel_event = anyio.Event()
        self._reported_files = set()
        self._terminal_streams.reset()
        try:
            try:
                raw = await self._prompt(prompt)
            except JsonRpcError as exc:
                await self._emit_all(turn.finish("cancelled" if self._cancel_requested else "failed"))
                if self._cancel_requested:
                    return self._outcome(turn, "cancelled")
                return TurnOutcome(
                    status="failed",
                    stop_reason="error",
                    final_message_id=turn.final_message_id,
                    final_message_text=turn.final_message_text,
                    error_code="provider.error",
                    error_message=f"session/prompt failed: {exc.message}",
                    error_details={"code": exc.code},
                )
            except ProviderError:
                await self._emit_all(turn.finish("failed"))
                raise
            self._recovery_pending = []
            self._instructions_pending = ""
            result = self._decode(raw, m.PromptResult, "session/prompt")
            if result.usage is not None:
                await self._emit_all(turn.prompt_usage(result.usage))
            stop = "cancelled" if self._cancel_requested else result.stop_reason
            if stop == "cancelled" and not self._cancel_requested and turn.declined:
                # codex-acp's only reject option ("abort") ends the whole turn as cancelled. Nobody
                # cancelled the run: it ended because the user said no, which is a normal end.
                stop = "permission_rejected"
            await self._emit_all(turn.finish(stop))
            return self._outcome(turn, stop)
        finally:
            self._turn = None
            self._cost_total = turn.cost_total
            if turn.unknown_updates:
                for variant, count in turn.unknown_updates.items():
                    self.unknown_updates[variant] = self.unknown_updates.get(variant, 0) + count
                log.info("acp.unknown_updates", counts=dict(turn.unknown_updates))

    async def _prompt(self, prompt: list[dict[str, Any]]) -> Any:
        """session/prompt, re-sending session/cancel while a requested cancel has not ended it.

        A cancel can be written before the prompt itself (both are queued on the same pipe, and the
        prompt's writer task may not have run yet); the agent then ignores it as a cancel of nothing
        and runs the whole turn. Re-sending it (a notification, harmless when repeated) closes that gap.
        """
        answer: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:

            async def nudge() -> None:
                await self._cancel_event.wait()
                for _ in range(CANCEL_RESENDS):
                    await anyio.sleep(CANCEL_RESEND_INTERVAL)
                    await self._send_cancel()

            tg.start_soon(nudge)
            try:
                params: dict[str, Any] = {"sessionId": self._session_id, "prompt": prompt}
                if traceparent := tracing.run_traceparent():
                    params["_meta"] = {"traceparent": traceparent}  # ACP's reserved trace context key
                answer["result"] = await self._call("session/prompt", params)
            except (JsonRpcError, ProviderError) as exc:
                answer["error"] = exc
            tg.cancel_scope.cancel()
        if "error" in answer:
            raise answer["error"]
        return answer["result"]

    def _outcome(self, turn: AcpTurn, stop: str) -> TurnOutcome:
        common: dict[str, Any] = {
            "final_message_id": turn.final_message_id,
            "final_message_text": turn.final_message_text,
            "usage": turn.usage,
        }
        if stop == "cancelled":
            return TurnOutcome(status="cancelled", stop_reason="cancelled", **common)
        if stop in FAILED_STOP_REASONS:
            return TurnOutcome(
                status="failed",
                stop_reason=stop,
                error_code=stop,
                error_message=f"the agent stopped the turn: {stop}",
                **common,
            )
        if stop not in ("end_turn", "permission_rejected"):
            log.warning("acp.unknown_stop_reason", stop_reason=stop)
        return TurnOutcome(status="completed", stop_reason=stop, **common)

    def _prompt_blocks(self, run_input: RunInput) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if self._instructions_pending:
            blocks.append({"type": "text", "text": f"<instructions>\n{self._instructions_pending}\n</instructions>"})
        if self._recovery_pending:
            lines = [
                "Context: the earlier conversation of this session could not be resumed natively. "
                "Here it is, for reference:"
            ]
            lines.extend(f"{role}: {text}" for role, text in self._recovery_pending)
            blocks.append({"type": "text", "text": "\n".join(lines)})
        blocks.append({"type": "text", "text": run_input.text})
        assert self.agent is not None
        try:
            blocks.extend(acp_session.attachment_blocks(self._cwd, run_input.attachments, self.agent))
        except (attachments.AttachmentRefused, OSError) as exc:
            raise ProviderError("command.invalid", str(exc)) from None
        return blocks

    async def cancel(self) -> None:
        if self._turn is None:
            return
        self._cancel_requested = True
        self._turn.cancelling = True
        self._cancel_event.set()
        for scope in list(self._permission_scopes):
            scope.cancel()
        await self._send_cancel()

    async def _send_cancel(self) -> None:
        if self._peer is not None and self._session_id is not None:
            with contextlib.suppress(PeerClosed):
                await self._peer.notify("session/cancel", {"sessionId": self._session_id})

    # ---- agent → client ---------------------------------------------------------------------

    async def _on_notification(self, method: str, params: Any) -> None:
        if method != "session/update":
            log.debug("acp.notification_ignored", method=method)
            return
        try:
            note = m.decode(params, m.SessionNotification)
        except msgspec.ValidationError as exc:
            log.warning("acp.bad_update", error=str(exc))
            return
        if note.session_id != self._session_id:
            return  # history replayed by session/load (its id is set once loaded), or another session's
        if note.update.get("sessionUpdate") in acp_state.STATE_UPDATES:
            # The session's mode, options and commands change between turns too: not run-scoped.
            await self._emit_all(self._state.feed(note.update))
            return
        turn = self._turn
        if turn is None:
            return  # late updates after the turn ended
        await self._emit_all(turn.feed(note.update))
        if turn.new_terminals and self._terminals is not None:
            await self._terminal_streams.link(turn, self._terminals)

    async def _on_request(self, method: str, params: Any) -> Any:
        if method == "session/request_permission":
            return await self._request_permission(self._decode_params(params, m.RequestPermissionParams))
        if method == "fs/read_text_file":
            content = await acp_fs.read_text_file(self.ports.files, self._decode_params(params, m.ReadTextFileParams))
            return {"content": content}
        if method == "fs/write_text_file":
            written = await acp_fs.write_text_file(self.ports.files, self._decode_params(params, m.WriteTextFileParams))
            await self._file_changed(written.path, "created" if written.created else "modified", written.sha256)
            return {}
        if method.startswith("terminal/"):
            return await self._terminal(method, params)
        raise JsonRpcError(m.METHOD_NOT_FOUND, f"method not found: {method}")

    async def _request_permission(self, req: m.RequestPermissionParams) -> dict[str, Any]:
        call = req.tool_call
        turn = self._turn
        if turn is None or self._cancel_requested:
            return acp_permissions.CANCELLED
        await self._emit_all(turn.announce_tool(call))
        options = acp_permissions.offered(req.options)
        if self.config.execution.permission_policy == "full_access":
            chosen = acp_permissions.pick(options, acp_permissions.ALLOW_KINDS)
            log.info("acp.permission_auto_allowed", tool_call_id=call.tool_call_id, allowed=chosen is not None)
            return acp_permissions.selected(chosen)
        decision: PermissionDecision | None = None
        with anyio.CancelScope() as scope:
            self._permission_scopes.add(scope)
            try:
                decision = await self.ports.permissions.request(acp_permissions.to_request(call, options))
            finally:
                self._permission_scopes.discard(scope)
        if decision is None or self._cancel_requested:
            return acp_permissions.CANCELLED
        outcome, rejected = acp_permissions.answer(options, decision)
        if rejected:
            await self._emit_all(turn.decline_tool(call.tool_call_id))
        return outcome

    async def _terminal(self, method: str, params: Any) -> Any:
        terminals = self._terminals
        if terminals is None:
            raise JsonRpcError(m.INTERNAL_ERROR, "terminals are not available (agent stopping)")
        try:
            if method == "terminal/create":
                p = self._decode_params(params, m.CreateTerminalParams)
                cwd = acp_fs.admit(self.ports.files, p.cwd) if p.cwd else None
                terminal_id = await terminals.create(
                    p.command,
                    p.args,
                    env={e.name: e.value for e in p.env},
                    cwd=cwd,
                    output_byte_limit=p.output_byte_limit,
                )
                return {"terminalId": terminal_id}
            t = self._decode_params(params, m.TerminalParams)
            if method == "terminal/output":
                return terminals.output(t.terminal_id)
            if method == "terminal/wait_for_exit":
                return await terminals.wait_for_exit(t.terminal_id)
            if method == "terminal/kill":
                terminals.kill(t.terminal_id)
                return {}
            if method == "terminal/release":
                await terminals.release(t.terminal_id)
                return {}
        except TerminalError as exc:
            raise JsonRpcError(m.INVALID_PARAMS, str(exc)) from None
        raise JsonRpcError(m.METHOD_NOT_FOUND, f"method not found: {method}")

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
        """A best-effort setting: a refusal is logged, never fatal. Returns the answer, or _REFUSED."""
        try:
            return await self._call(method, params)
        except JsonRpcError as exc:
            log.warning("acp.call_refused", method=method, code=exc.code, error=exc.message)
            return _REFUSED

    async def _call(self, method: str, params: dict[str, Any]) -> Any:
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
                    answer["result"] = await peer.request(method, params)
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
