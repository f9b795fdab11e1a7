"""The `openai-app-server` runtime: the real Codex binary's `app-server`, over stdio JSON-RPC.

Lifecycle: `start()` writes `$CODEX_HOME/config.toml` (see `codex_config`), spawns the platform binary
directly (not through the node wrapper), then `initialize` -> `initialized` -> `thread/start` (or
`thread/resume` when the boot payload names a thread; a thread that cannot be resumed is replaced by a
fresh one, reported by `runtime.session.reset`, and the recovery messages are replayed as context on
the next turn). `run()` is one `turn/start`, mapped to events by `codex_turn.CodexTurn` until
`turn/completed`. Approval requests from Codex go through the permissions port.

The process and its JSON-RPC peer are `codex_process.CodexProcess`; which thread to open is decided by
`codex_thread`, how a turn ends by `codex_outcome`; this module says what goes over the peer and when.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import anyio

from driver import logs, tasks
from driver.adapters.codex import files as codex_files
from driver.adapters.codex import notices as codex_notices
from driver.adapters.codex import requests as codex_requests
from driver.adapters.codex import steer as codex_steer
from driver.adapters.codex import thread as codex_thread
from driver.adapters.codex.config import CodexSettings
from driver.adapters.codex.files import codex_binary
from driver.adapters.codex.outcome import refused_outcome, turn_outcome
from driver.adapters.codex.process import CodexProcess, watch_exit
from driver.adapters.codex.thread import RUNTIME
from driver.adapters.codex.turn import CodexTurn, FileTouched
from driver.adapters.common import attachments, changed_files, host_server, instructions
from driver.adapters.common.base import Adapter, AdapterConfig, Ports, ProviderError, SteerRefused, TurnOutcome
from driver.adapters.common.host_server import HOST_TOKEN_ENV
from driver.adapters.common.jsonrpc import METHOD_NOT_FOUND, JsonRpcError, PeerClosed
from driver.ports.mcp_host import McpHostServer
from driver.protocol.capabilities import BY_RUNTIME
from driver.protocol.commands import RunInput
from driver.telemetry import tracing

log = logs.get(__name__)


class CodexAdapter(Adapter):
    runtime: ClassVar[str] = RUNTIME
    # Declared once, in driver/protocol/capabilities.py, so `hello` can state them without importing this module.
    capabilities: ClassVar[frozenset[str]] = BY_RUNTIME["openai-app-server"]
    start_timeout: float = 30.0
    stop_grace: float = 3.0

    def __init__(self, config: AdapterConfig, ports: Ports) -> None:
        super().__init__(config, ports)
        self._cwd = Path(config.session.cwd)
        self._codex = CodexProcess(stop_grace=self.stop_grace)
        self._host: McpHostServer | None = None
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
        return self._codex.group_ids()

    def _prepare_home(self, host_mcp_url: str | None) -> tuple[Path, dict[str, str]]:
        home, extra_env, self._settings = codex_files.prepare_home(self.config, host_mcp_url)
        return home, extra_env

    async def start(self) -> None:
        binary = codex_binary(self.config.project_root)
        host_url: str | None = None
        # A continued Codex keeps calling the dead driver's server address: it is served again.
        if self.config.execution.host_tools:
            self._host = await host_server.start(self.config, self.ports.host_tools)
            host_url = self._host.url
        home, extra_env = self._prepare_home(host_url)
        env = {**self.config.env, **extra_env, "CODEX_HOME": str(home)}
        if self._host is not None:
            env[HOST_TOKEN_ENV] = self._host.token
        env["PATH"] = os.pathsep.join(
            [str(codex_files.helper_aliases(self.config.state_dir, binary)), env.get("PATH", os.defpath)]
        )
        env.setdefault("HOME", str(home))
        plan = await self._codex.open(
            [str(binary), "app-server"],
            env=env,
            cwd=self._cwd,
            config=self.config,
            runtime=RUNTIME,
            emit=self.ports.emit,
            on_request=self._on_request,
            on_notification=self._on_notification,
            host=self._host,
        )
        if plan is not None and plan.thread_id is not None:
            # A predecessor's Codex, initialized, its thread open: continue where its output log is.
            # No await since open(): the peer's reader (a task not yet run) finds the turn in place.
            self._thread_id = plan.thread_id
            if plan.run_id is not None:
                self._turn = CodexTurn(plan.run_id, str(self._cwd), plan.thread_id, admit=self.ports.files.admit)
                self._turn_ended = anyio.Event()
            await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": self._thread_id})
            return
        try:
            with anyio.fail_after(self.start_timeout):
                await self._call("initialize", {"clientInfo": {"name": "agent-driver", "version": "0.1.0"}})
                await self._codex.notify("initialized")
                await self._open_thread()
            self._mark(None)
        except TimeoutError:
            raise ProviderError(
                "provider.start_timeout",
                f"codex did not start within {self.start_timeout:g} s",
                retryable=True,
                details={"stderr_tail": self._codex.stderr_tail()},
            ) from None
        except BaseException:
            await self.stop()
            raise

    def _thread_params(self) -> dict[str, Any]:
        assert self._settings is not None
        developer = instructions.compose(self.config.execution, self.config.session)
        return codex_thread.thread_params(self._settings, self._cwd, developer)

    async def _open_thread(self) -> None:
        """Resume the thread this adapter had before a restart, else the boot payload's, else start one
        (codex_thread.opening)."""
        plan = codex_thread.opening(self._thread_id, self.config.execution.native_resume)
        if (foreign := plan.foreign) is not None:
            await self._replace_thread(foreign.value, f"a {foreign.runtime} session cannot be resumed by codex")
        elif plan.resume is not None:
            try:
                result = await self._call("thread/resume", {**self._thread_params(), "threadId": plan.resume})
                self._thread_id = codex_thread.thread_of(result)
            except JsonRpcError as exc:
                await self._replace_thread(plan.resume, exc.message)
                if not plan.recovery:
                    self._recovery_pending = []
        else:
            self._thread_id = await self._new_thread()
            # No thread to resume but a history to keep (PROTOCOL §8): replayed on the next turn.
            self._recovery_pending = codex_thread.recovery_of(self.config.execution.recovery_messages)
        await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": self._thread_id})

    async def _replace_thread(self, previous: str, why: str) -> None:
        log.info("codex.resume_failed", thread_id=previous, error=why)
        self._thread_id = await self._new_thread()
        self._recovery_pending = codex_thread.recovery_of(self.config.execution.recovery_messages)
        await self.ports.emit("runtime.session.reset", {"previous": previous, "current": self._thread_id})

    async def _new_thread(self) -> str:
        return codex_thread.thread_of(await self._call("thread/start", self._thread_params()))

    async def reset(self) -> tuple[str | None, str | None]:
        previous = self._thread_id
        self._thread_id = await self._new_thread()
        self._recovery_pending = []
        self._mark(None)
        await self.ports.emit("runtime.resume.updated", {"runtime": RUNTIME, "value": self._thread_id})
        return previous, self._thread_id

    def _mark(self, run_id: str | None) -> None:
        self._codex.mark(run_id, self._thread_id)

    async def wait_exited(self) -> None:
        await self._codex.wait_exited()

    def stderr_tail(self) -> str:
        return self._codex.stderr_tail()

    def detach(self) -> bool:
        return self._codex.detach()

    async def stop(self) -> None:
        host, self._host = self._host, None
        await self._codex.stop(then=host.close if host is not None else None)

    async def _call(self, method: str, params: dict[str, Any], extra: dict[str, Any] | None = None) -> Any:
        return await self._codex.call(method, params, extra)

    # -- one turn ------------------------------------------------------------------------------

    def _input_items(self, run_input: RunInput, *, recovery: bool = True) -> list[dict[str, Any]]:
        text = codex_thread.with_recovery(run_input.text, self._recovery_pending if recovery else [])
        # The kernel downloads attachments into cwd/inputs/ before the run and names them in the text;
        # images also go to the model as images.
        try:
            local = attachments.local(self._cwd, run_input.attachments, max_image_bytes=None)
        except attachments.AttachmentRefused as exc:
            raise ProviderError("command.invalid", str(exc)) from None
        images = [{"type": "localImage", "path": str(a.path)} for a in local if a.kind == "image"]
        return [{"type": "text", "text": text}, *images]

    async def run(self, run_id: str, run_input: RunInput) -> TurnOutcome:
        peer, proc = self._codex.peer, self._codex.proc
        if peer is None or proc is None or self._thread_id is None:
            raise ProviderError("provider.not_started", "codex has no open thread")
        if self._turn is not None:
            raise ProviderError("driver.run_active", "a turn is already running", retryable=True)
        if peer.closed.is_set() or proc.returncode is not None:
            raise await self._codex.crashed("codex is not running")
        turn = CodexTurn(run_id, str(self._cwd), self._thread_id, admit=self.ports.files.admit)
        self._turn = turn
        self._mark(run_id)
        self._cancel_requested = anyio.Event()
        ended = anyio.Event()  # set by turn/completed, or by Codex going away
        self._turn_ended = ended
        failure: ProviderError | JsonRpcError | None = None
        try:
            async with tasks.within("codex turn") as tg:
                tg.spawn(self._interrupt_when_asked, turn)
                tg.spawn(watch_exit, peer, proc, ended)
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
            return refused_outcome(failure, cancel_requested=self._cancel_requested.is_set())
        if failure is not None:
            raise failure
        if turn.end is None:
            raise await self._codex.crashed("codex exited during the turn")
        return turn_outcome(turn, cancel_requested=self._cancel_requested.is_set())

    async def resume(self, run_id: str) -> TurnOutcome:
        """Continue a turn a dead driver left running (PROTOCOL §8.2): its output is being re-read from
        the turn's start through a fresh `CodexTurn`; the kernel's gate suppresses what was journaled."""
        turn, peer, proc = self._turn, self._codex.peer, self._codex.proc
        if turn is None or turn.run_id != run_id or peer is None or proc is None:
            return await super().resume(run_id)
        self._cancel_requested = anyio.Event()
        ended = self._turn_ended
        try:
            async with tasks.within("codex turn") as tg:
                tg.spawn(self._interrupt_when_asked, turn)
                tg.spawn(watch_exit, peer, proc, ended)
                await ended.wait()
                tg.cancel_scope.cancel()
        finally:
            self._turn = None
        if turn.end is None:
            raise await self._codex.crashed("codex exited during the turn")
        return turn_outcome(turn, cancel_requested=self._cancel_requested.is_set())

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
            peer = self._codex.peer
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
            peer = self._codex.peer
            if peer is not None and isinstance(request_id, int | str):
                peer.cancel_incoming(request_id)
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
                # Admitted by the turn (out.path is resolved, inside the allowed roots); opened
                # without following a link planted since.
                digest = (
                    None
                    if out.change == "deleted"
                    else await anyio.to_thread.run_sync(changed_files.sha256_of, Path(out.path))
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
