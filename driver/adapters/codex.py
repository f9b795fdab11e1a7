"""The `openai-app-server` runtime: the real Codex binary's `app-server`, over stdio JSON-RPC.

Lifecycle: `start()` writes `$CODEX_HOME/config.toml` (see `codex_config`), spawns the platform binary
directly (not through the node wrapper), then `initialize` -> `initialized` -> `thread/start` (or
`thread/resume` when the boot payload names a thread; a thread that cannot be resumed is replaced by a
fresh one, reported by `runtime.session.reset`, and the recovery messages are replayed as context on
the next turn). `run()` is one `turn/start`, mapped to events by `codex_turn.CodexTurn` until
`turn/completed`. Approval requests from Codex go through the permissions port.

Background work: the JSON-RPC read loop runs as a task on the event loop for the life of the process
(as `ProviderProcess` does for its stderr), because the process outlives every single adapter call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any, ClassVar

import anyio

from driver import guard, logs
from driver.adapters import attachments, codex_files, codex_notices, codex_requests, codex_steer, instructions
from driver.adapters.base import (
    Adapter,
    AdapterConfig,
    Ports,
    ProviderError,
    SteerRefused,
    TurnOutcome,
)
from driver.adapters.codex_config import (
    HOST_TOKEN_ENV,
    CodexSettings,
)
from driver.adapters.codex_files import codex_binary
from driver.adapters.codex_turn import CodexTurn, FileTouched
from driver.adapters.jsonrpc import METHOD_NOT_FOUND, JsonRpcError, JsonRpcPeer, PeerClosed
from driver.adapters.keeping import AnyProcess, provider_process
from driver.adapters.protocol_diagnostics import ProtocolDiagnostics
from driver.capabilities import BY_RUNTIME
from driver.kept import KeptProcess
from driver.ports.mcp_host import McpHostServer
from driver.protocol.commands import RunInput
from driver.telemetry import tracing

log = logs.get(__name__)

RUNTIME = "openai-app-server"


class CodexAdapter(Adapter):
    runtime: ClassVar[str] = RUNTIME
    # Declared once, in driver/capabilities.py, so `hello` can state them without importing this module.
    capabilities: ClassVar[frozenset[str]] = BY_RUNTIME["openai-app-server"]
    start_timeout: float = 30.0
    stop_grace: float = 3.0

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        super().__init__(config, ports)
        self._cwd = Path(config.session.cwd)
        self._proc: AnyProcess | None = None
        self._proc_changed = anyio.Event()
        self._host: McpHostServer | None = None
        self._peer: JsonRpcPeer | None = None
        self._peer_task: asyncio.Task[None] | None = None
        self._thread_id: str | None = None
        self._settings: CodexSettings | None = None
        self._turn: CodexTurn | None = None
        self._turn_changed = anyio.Event()
        self._cancel_requested = anyio.Event()
        self._turn_ended = anyio.Event()
        self._recovery_pending: list[tuple[str, str]] = []

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def native_id(self) -> str | None:
        return self._thread_id

    def process_group_ids(self) -> list[int]:
        if isinstance(self._proc, KeptProcess) and self._proc.returncode is None:
            return self._proc.group_ids()
        return [self._proc.pgid] if self._proc is not None and self._proc.returncode is None else []

    def _prepare_home(self, host_mcp_url: str | None) -> tuple[Path, dict[str, str]]:
        home, extra_env, self._settings = codex_files.prepare_home(self.config, host_mcp_url)
        return home, extra_env

    async def start(self) -> None:
        binary = codex_binary(self.config.project_root)
        host_url: str | None = None
        # Host tools are not carried across a reattach: the continued Codex keeps the dead driver's
        # MCP server address (documented in docs/protocol.md).
        if self.config.execution.host_tools:
            self._host = McpHostServer(self.config.execution.host_tools, self.ports.host_tools)
            await self._host.start()
            host_url = self._host.url
        home, extra_env = self._prepare_home(host_url)
        env = {**self.config.env, **extra_env, "CODEX_HOME": str(home)}
        if self._host is not None:
            env[HOST_TOKEN_ENV] = self._host.token
        env["PATH"] = os.pathsep.join(
            [str(codex_files.helper_aliases(self.config.state_dir, binary)), env.get("PATH", os.defpath)]
        )
        env.setdefault("HOME", str(home))
        proc, plan = await provider_process(
            [str(binary), "app-server"], env=env, cwd=self._cwd, name="codex", config=self.config, runtime=RUNTIME
        )
        self._set_proc(proc)
        if plan is not None and plan.thread_id is not None:
            # A predecessor's Codex, initialized, its thread open: continue where its output log is.
            self._thread_id = plan.thread_id
            if plan.run_id is not None:
                self._turn = CodexTurn(plan.run_id, str(self._cwd), plan.thread_id)
                self._turn_ended = anyio.Event()
        peer = JsonRpcPeer(
            proc.stdout,
            proc.stdin,
            name="codex",
            jsonrpc_version=None,
            on_request=self._on_request,
            on_notification=self._on_notification,
            on_violation=ProtocolDiagnostics(self.ports.emit, "codex app-server"),
            on_handler_error=guard.PortErrors(self.ports.emit, "codex app-server"),
            first_id=plan.first_id if plan is not None else 0,
            answered=plan.answered if plan is not None else frozenset(),
        )
        self._peer = peer
        self._peer_task = asyncio.get_running_loop().create_task(peer.run(), name="codex-rpc")
        if plan is not None and plan.thread_id is not None:
            await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": self._thread_id})
            return
        try:
            with anyio.fail_after(self.start_timeout):
                await self._call("initialize", {"clientInfo": {"name": "agent-driver", "version": "0.1.0"}})
                await peer.notify("initialized")
                await self._open_thread()
            self._mark(None)
        except TimeoutError:
            raise ProviderError(
                "provider.start_timeout",
                f"codex did not start within {self.start_timeout:g} s",
                retryable=True,
                details={"stderr_tail": proc.stderr_tail()},
            ) from None
        except BaseException:
            await self.stop()
            raise

    def _thread_params(self) -> dict[str, Any]:
        assert self._settings is not None
        params: dict[str, Any] = {
            "cwd": str(self._cwd),
            "model": self._settings.model,
            "approvalPolicy": self._settings.approval_policy,
            "sandbox": self._settings.sandbox,
        }
        # The execution's prompt and the driver's paragraph ride as developer instructions (Codex keeps
        # its own base instructions); skills are in CODEX_HOME/skills, which Codex lists itself.
        params["developerInstructions"] = instructions.compose(self.config.execution, self.config.session)
        if self._settings.config_overrides:
            params["config"] = self._settings.config_overrides
        return params

    async def _open_thread(self) -> None:
        """Resume the thread this adapter had before a restart, else the boot payload's, else start one.

        A boot-payload thread that cannot be resumed is replaced and the recovery messages are replayed
        on the next turn; our own earlier thread needs no replay of them (they are older than it)."""
        boot = self.config.execution.native_resume
        previous, recovery = self._thread_id, False
        if previous is None and boot is not None:
            previous, recovery = boot.value, True
            if boot.runtime != RUNTIME:
                # Another runtime's session id: Codex cannot resume it.
                previous = None
                await self._replace_thread(boot.value, f"a {boot.runtime} session cannot be resumed by codex")
        if previous is not None:
            try:
                result = await self._call("thread/resume", {**self._thread_params(), "threadId": previous})
                self._thread_id = self._thread_of(result)
            except JsonRpcError as exc:
                await self._replace_thread(previous, exc.message)
                if not recovery:
                    self._recovery_pending = []
        elif self._thread_id is None:
            self._thread_id = await self._new_thread()
            # No thread to resume but a history to keep (PROTOCOL §8): replayed on the next turn.
            self._recovery_pending = [(m.role, m.text) for m in self.config.execution.recovery_messages]
        await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": self._thread_id})

    async def _replace_thread(self, previous: str, why: str) -> None:
        log.info("codex.resume_failed", thread_id=previous, error=why)
        self._thread_id = await self._new_thread()
        self._recovery_pending = [(m.role, m.text) for m in self.config.execution.recovery_messages]
        await self.ports.emit("runtime.session.reset", {"previous": previous, "current": self._thread_id})

    async def _new_thread(self) -> str:
        return self._thread_of(await self._call("thread/start", self._thread_params()))

    @staticmethod
    def _thread_of(result: Any) -> str:
        thread = result.get("thread") if isinstance(result, dict) else None
        thread_id = thread.get("id") if isinstance(thread, dict) else None
        if not isinstance(thread_id, str):
            raise ProviderError("provider.protocol", "codex answered without a thread id")
        return thread_id

    async def reset(self) -> tuple[str | None, str | None]:
        previous = self._thread_id
        self._thread_id = await self._new_thread()
        self._recovery_pending = []
        self._mark(None)
        await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": self._thread_id})
        return previous, self._thread_id

    def _mark(self, run_id: str | None) -> None:
        """Tell a keeper's successor which run is in flight and where its turn's output starts."""
        if isinstance(self._proc, KeptProcess) and self._thread_id is not None:
            self._proc.mark_turn(run_id, self._thread_id)

    def _set_proc(self, proc: AnyProcess | None) -> None:
        self._proc = proc
        self._proc_changed.set()
        self._proc_changed = anyio.Event()

    async def wait_exited(self) -> None:
        # Watch whichever process is current: stop() clears `_proc` before terminating it, so an exit
        # we caused ourselves is never reported as Codex dying on its own.
        while True:
            proc = self._proc
            if proc is None:
                await self._proc_changed.wait()
                continue
            await proc.exited.wait()
            if self._proc is proc:
                return

    def stderr_tail(self) -> str:
        return self._proc.stderr_tail() if self._proc is not None else ""

    def detach(self) -> bool:
        proc = self._proc
        if not isinstance(proc, KeptProcess):
            return False
        # Freeze, do not close: a closed stream would end the run in flight as a crash. What the keeper
        # logs from now on is the successor's to read.
        proc.detach()
        return True

    async def stop(self) -> None:
        proc = self._proc
        self._set_proc(None)
        task, self._peer_task = self._peer_task, None
        self._peer = None
        host, self._host = self._host, None
        with anyio.CancelScope(shield=True):
            if proc is not None:
                await proc.terminate(grace=self.stop_grace)
            if host is not None:
                await host.close()
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    # -- requests to Codex ---------------------------------------------------------------------

    async def _call(self, method: str, params: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
        """A request that fails with `provider.crashed` if Codex dies before answering."""
        peer, proc = self._peer, self._proc
        if peer is None or proc is None:
            raise ProviderError("provider.not_started", "codex is not running")
        try:
            return await peer.request(method, params, extra=extra)
        except PeerClosed:
            raise await self._crashed(f"codex exited during {method}") from None

    async def _crashed(self, message: str) -> ProviderError:
        proc = self._proc
        code: int | None = None
        tail = ""
        if proc is not None:
            with anyio.move_on_after(2.0):
                code = await proc.wait()
            tail = proc.stderr_tail()
        suffix = f" (status {code})" if code is not None else ""
        last_line = tail.strip().rsplit("\n", 1)[-1] if tail.strip() else ""
        if last_line:
            suffix += f": {last_line[:300]}"
        return ProviderError(
            "provider.crashed", message + suffix, retryable=True, details={"stderr_tail": tail, "exit_code": code}
        )

    # -- one turn ------------------------------------------------------------------------------

    def _input_items(self, run_input: RunInput, *, recovery: bool = True) -> list[dict[str, Any]]:
        text = run_input.text
        if recovery and self._recovery_pending:
            lines = ["Context: the earlier conversation of this session could not be resumed. Here it is:"]
            lines += [f"{role}: {said}" for role, said in self._recovery_pending]
            text = "\n".join(lines) + "\n\n" + text
        # The kernel downloads attachments into cwd/inputs/ before the run and names them in the text;
        # images also go to the model as images.
        try:
            local = attachments.local(self._cwd, run_input.attachments, max_image_bytes=None)
        except attachments.AttachmentRefused as exc:
            raise ProviderError("command.invalid", str(exc)) from None
        images = [{"type": "localImage", "path": str(a.path)} for a in local if a.kind == "image"]
        return [{"type": "text", "text": text}, *images]

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        peer, proc = self._peer, self._proc
        if peer is None or proc is None or self._thread_id is None:
            raise ProviderError("provider.not_started", "codex has no open thread")
        if self._turn is not None:
            raise ProviderError("driver.run_active", "a turn is already running", retryable=True)
        if peer.closed.is_set() or proc.returncode is not None:
            raise await self._crashed("codex is not running")
        turn = CodexTurn(run_id, str(self._cwd), self._thread_id)
        self._turn = turn
        self._mark(run_id)
        self._cancel_requested = anyio.Event()
        ended = anyio.Event()  # set by turn/completed, or by Codex going away
        self._turn_ended = ended
        failure: ProviderError | JsonRpcError | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._interrupt_when_asked, turn)
                tg.start_soon(self._watch_exit, peer, proc, ended)
                try:
                    # The run's trace context rides on the request (Codex's JSON-RPC `trace` field).
                    traceparent = tracing.run_traceparent()
                    result = await self._call(
                        "turn/start",
                        {"threadId": self._thread_id, "input": self._input_items(run_input)},
                        {"trace": {"traceparent": traceparent}} if traceparent else None,
                    )
                    started = result.get("turn") if isinstance(result, dict) else None
                    if turn.turn_id is None and isinstance(started, dict) and isinstance(started.get("id"), str):
                        turn.turn_id = started["id"]
                        self._notify_turn_changed()
                    self._recovery_pending = []
                    await ended.wait()
                except (ProviderError, JsonRpcError) as exc:
                    failure = exc
                tg.cancel_scope.cancel()
        finally:
            self._turn = None
        if isinstance(failure, JsonRpcError):
            cancelled = self._cancel_requested.is_set()
            return TurnOutcome(
                status="cancelled" if cancelled else "failed",
                stop_reason="cancelled" if cancelled else "error",
                error_code="provider.error",
                error_message=f"codex refused turn/start: {failure.message}",
                error_details={"code": failure.code},
            )
        if failure is not None:
            raise failure
        if turn.end is None:
            raise await self._crashed("codex exited during the turn")
        return self._outcome(turn)

    async def resume(self, run_id: str) -> TurnOutcome:
        """Continue a turn a dead driver left running (PROTOCOL §8.2): its output is being re-read from
        the turn's start through a fresh `CodexTurn`; the kernel's gate suppresses what was journaled."""
        turn, peer, proc = self._turn, self._peer, self._proc
        if turn is None or turn.run_id != run_id or peer is None or proc is None:
            return await super().resume(run_id)
        self._cancel_requested = anyio.Event()
        ended = self._turn_ended
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._interrupt_when_asked, turn)
                tg.start_soon(self._watch_exit, peer, proc, ended)
                await ended.wait()
                tg.cancel_scope.cancel()
        finally:
            self._turn = None
        if turn.end is None:
            raise await self._crashed("codex exited during the turn")
        return self._outcome(turn)

    @staticmethod
    async def _watch_exit(peer: JsonRpcPeer, proc: AnyProcess, ended: anyio.Event) -> None:
        """End the wait when Codex goes away: its stdout closes, or it exits (then give the reader a
        moment to take the last lines, in case a grandchild keeps stdout open)."""
        async with anyio.create_task_group() as tg:

            async def closed() -> None:
                await peer.closed.wait()
                tg.cancel_scope.cancel()

            async def exited() -> None:
                await proc.exited.wait()
                with anyio.move_on_after(2.0):
                    await peer.closed.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(closed)
            tg.start_soon(exited)
        ended.set()

    def _notify_turn_changed(self) -> None:
        self._turn_changed.set()
        self._turn_changed = anyio.Event()

    async def _interrupt_when_asked(self, turn: CodexTurn) -> None:
        """Send turn/interrupt once a cancel is asked and Codex has announced the turn (turn/start may
        still be in flight when the cancel arrives, and Codex refuses an interrupt before turn/started)."""
        await self._cancel_requested.wait()
        for _attempt in range(3):
            while not turn.active and turn.end is None:
                await self._turn_changed.wait()
            peer = self._peer
            if turn.end is not None or peer is None or turn.turn_id is None:
                return
            try:
                await peer.request("turn/interrupt", {"threadId": turn.thread_id, "turnId": turn.turn_id})
                return
            except PeerClosed:
                return
            except JsonRpcError as exc:
                log.warning("codex.interrupt_refused", error=exc.message)
                # Not active after all (a race with a turn boundary): retry on Codex's next word.
                with anyio.move_on_after(1.0):
                    await self._turn_changed.wait()

    def _outcome(self, turn: CodexTurn) -> TurnOutcome:
        assert turn.end is not None
        common: dict[str, Any] = {
            "final_message_id": turn.final_message_id,
            "final_message_text": turn.final_message_text,
            "usage": turn.usage_payload,
        }
        if turn.end.status == "interrupted" or (self._cancel_requested.is_set() and turn.end.status != "completed"):
            return TurnOutcome(status="cancelled", stop_reason="cancelled", **common)
        if turn.end.status == "failed":
            return TurnOutcome(
                status="failed",
                stop_reason="error",
                error_code="provider.error",
                error_message=turn.end.error_message or "codex reported the turn as failed",
                error_details={"codex_error": turn.end.error_info} if turn.end.error_info else None,
                **common,
            )
        return TurnOutcome(status="completed", stop_reason="end_turn", **common)

    async def steer(self, run_id: str, run_input: RunInput) -> None:
        turn = self._turn
        if turn is None or turn.run_id != run_id or turn.end is not None:
            raise SteerRefused("run.not_active", "no codex turn is running for this run")
        items = self._input_items(run_input, recovery=False)
        taken = await codex_steer.steer(self._call, turn, items, lambda: self._turn_changed, self._cancel_requested)
        log.info("codex.steered", run_id=run_id, turn_id=taken)

    async def cancel(self) -> None:
        if self._turn is None:
            return
        self._cancel_requested.set()
        # Returns once the interrupt is on its way; run() then ends with the turn's `interrupted`.
        with anyio.move_on_after(2.0):
            while self._turn is not None and self._turn.turn_id is None:
                await self._turn_changed.wait()

    # -- notifications and server requests -----------------------------------------------------

    async def _on_notification(self, method: str, params: Any) -> None:
        if method == "serverRequest/resolved":
            # Resolved without our answer (e.g. its turn was interrupted): stop waiting for a decision.
            # After our own answer this finds nothing to stop.
            request_id = params.get("requestId") if isinstance(params, dict) else None
            if self._peer is not None and isinstance(request_id, int | str):
                self._peer.cancel_incoming(request_id)
            return
        if method in codex_notices.NOTICES:
            notice = codex_notices.diagnostic(method, params)
            if notice is not None:
                await self.ports.emit("diagnostic.reported", notice)
            return
        turn = self._turn
        if turn is None or not turn.concerns(params):
            return
        had_turn_id, was_active = turn.turn_id is not None, turn.active
        for out in turn.handle(method, params):
            if isinstance(out, FileTouched):
                digest = (
                    None
                    if out.change == "deleted"
                    else await anyio.to_thread.run_sync(codex_files.sha256_file, out.path)
                )
                if (out.path, digest) not in turn.reported_files:
                    turn.reported_files.add((out.path, digest))
                    payload = {"path": out.relpath, "change": out.change, "sha256": digest}
                    await self.ports.emit("file.changed", payload)
            else:
                await self.ports.emit(*out)
        if turn.end is not None:
            self._turn_ended.set()
        if turn.end is not None or turn.active != was_active or (turn.turn_id is not None and not had_turn_id):
            self._notify_turn_changed()

    async def _on_request(self, method: str, params: Any) -> Any:
        if method == "mcpServer/elicitation/request" and isinstance(params, dict):
            return await self._mcp_elicitation(params)
        if method not in codex_requests.APPROVALS or not isinstance(params, dict):
            raise JsonRpcError(METHOD_NOT_FOUND, f"agent-driver does not handle {method}")
        turn = self._turn
        request = codex_requests.permission_request(
            method, params, lambda item_id: turn.change_paths.get(item_id, []) if turn is not None else []
        )
        decision = await self.ports.permissions.request(request)
        return codex_requests.answer(method, params, decision)

    async def _mcp_elicitation(self, params: dict[str, Any]) -> dict[str, Any]:
        turn = self._turn
        request = codex_requests.elicitation_request(params, turn.running_tool if turn is not None else None)
        if request is None:
            log.info("codex.elicitation_declined", server=params.get("serverName"))
            return {"action": "decline"}
        return codex_requests.elicitation_action(await self.ports.permissions.request(request))
