"""The kernel: driver states, command dispatch, run supervision, cancellation, shutdown.

One process serves one driver instance. The kernel owns the journal and outbox, the adapter and the
ports, and the link. A run is a task in its own cancel scope; its terminal is chosen once (first wins;
a cancel that arrives before the choice wins), emitted as a lossless event, and the run's
`input.start` completes only when that terminal has a receipt.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec

from driver import __version__, logs
from driver.adapters.base import CAPABILITIES, Adapter, AdapterConfig, PathNotAllowed, Ports, ProviderError, TurnOutcome
from driver.adapters.deferred import DeferredAdapter
from driver.adapters.environment import provider_env
from driver.adapters.registry import capabilities_of
from driver.ports import artifacts
from driver.ports.files import AllowedRoots
from driver.ports.host_tools import HostToolBroker, HostToolCommandError
from driver.ports.permissions import PermissionBroker, PermissionCommandError
from driver.protocol import commands as cmds
from driver.protocol.boot import BootPayload
from driver.protocol.events import EVENT_KINDS, RUN_TERMINALS, PayloadError, validate_payload
from driver.protocol.frames import (
    PROTOCOL_VERSION,
    TERMINAL_STATUSES,
    Capability,
    CommandError,
    CommandFrame,
    CommandUpdate,
    Heartbeat,
    HeartbeatOutbox,
    Hello,
    OutboxSummary,
    Welcome,
    encode,
)
from driver.protocol.link import CloseReaction
from driver.queue.journal import Journal
from driver.queue.outbox import FinalRejection, Outbox, utc_now
from driver.runs import Run, choose_terminal, declined_tool_events
from driver.states import StateMachine, Trigger
from driver.supervision import (
    CRASH_LOOP_LIMIT,
    CRASH_LOOP_WINDOW_S,
    RESTART_BACKOFF_BASE_S,
    RESTART_BACKOFF_CAP_S,
    CrashWindow,
    options_from_env,
)
from driver.supervisor import ProviderSupervisor

log = logs.get("driver.kernel")

CANCEL_INTERRUPT_GRACE_S = 5.0
CANCEL_TERM_GRACE_S = 3.0
STOP_DRAIN_TIMEOUT_S = 30.0
PROVIDER_START_TIMEOUT_S = 60.0
PROVIDER_STOP_TIMEOUT_S = 10.0
# A run whose provider emits nothing for this long (while no permission or host tool call waits on
# the control plane) has a provider that stopped answering: run.failed provider.unresponsive.
PROVIDER_SILENCE_TIMEOUT_S = 1800.0
# After the provider process exits during a run, how long its adapter gets to report the crash
# itself (with its own stderr tail) before the kernel ends the run for it.
PROVIDER_EXIT_GRACE_S = 3.0
MAX_PAYLOAD_BYTES = 1024 * 1024
EXIT_DRAIN_INCOMPLETE = 70  # EX_SOFTWARE: distinct from 75 (superseded)


def project_root() -> Path:
    """Where `node_modules` with the pinned provider runtimes lives."""
    env = os.environ.get("AGENT_DRIVER_PROJECT_ROOT")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class KernelOptions:
    cancel_interrupt_grace_s: float = CANCEL_INTERRUPT_GRACE_S
    cancel_term_grace_s: float = CANCEL_TERM_GRACE_S
    stop_drain_timeout_s: float = STOP_DRAIN_TIMEOUT_S
    provider_start_timeout_s: float = PROVIDER_START_TIMEOUT_S
    provider_stop_timeout_s: float = PROVIDER_STOP_TIMEOUT_S
    provider_silence_timeout_s: float = PROVIDER_SILENCE_TIMEOUT_S  # 0: never
    restart_backoff_base_s: float = RESTART_BACKOFF_BASE_S
    restart_backoff_cap_s: float = RESTART_BACKOFF_CAP_S
    crash_loop_limit: int = CRASH_LOOP_LIMIT
    crash_loop_window_s: float = CRASH_LOOP_WINDOW_S
    outbox_max_events: int = 100_000  # PROTOCOL §4.1's default bound on unreceipted lossless events

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> KernelOptions:
        """Defaults overridden by `AGENT_DRIVER_*` variables (driver.supervision.ENV_OPTIONS), so tests
        and operators can shorten the bounds of a real driver process from outside."""
        return cls(**options_from_env(environ))  # type: ignore[arg-type]


class Kernel:
    def __init__(self, boot: BootPayload, *, started_at: float, options: KernelOptions | None = None) -> None:
        self.boot = boot
        self.options = options or KernelOptions.from_env(os.environ)
        self.started_monotonic = started_at
        self.started_at_iso = utc_now()
        self.state = StateMachine()
        state_dir = Path(boot.session.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.journal = Journal(state_dir / "driver" / "journal.sqlite3")
        self.epoch = self.journal.bump_epoch()
        self.outbox = Outbox(
            self.journal,
            boot.driver_instance_id,
            boot.session.id,
            self.epoch,
            max_events=self.options.outbox_max_events,
        )
        self.run: Run | None = None
        self.exit_status: int | None = None
        self._done = anyio.Event()
        self._in_progress: dict[str, str] = {}  # command_id → fingerprint, for commands not yet terminal
        self._last_activity = time.monotonic()
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping = False
        self._link: Any = None
        ex = boot.execution
        self.permissions = PermissionBroker(
            self.emit,
            policy=ex.permission_policy,
            timeout_ms=ex.permission_timeout_ms,
            id_prefix=f"prm-{self.epoch}",
            on_pending_change=self._permission_pending_changed,
        )
        self.host_tools = HostToolBroker(
            self.emit,
            id_prefix=f"htc-{self.epoch}",
            current_run=lambda: self.run.run_id if self.run else None,
            known={t.name for t in ex.host_tools},
        )
        roots = [boot.session.memory_dir, *boot.session.additional_directories]
        self.files = AllowedRoots(boot.session.cwd, roots)
        self.ports = Ports(self, self.permissions, self.host_tools, self.files)
        # Static: `hello` is built before the adapter's module (and its SDK) is imported.
        self.capabilities = capabilities_of(ex.runtime)
        opts = self.options
        self.supervisor = ProviderSupervisor(
            self._new_adapter,
            self.emit,
            start_timeout_s=opts.provider_start_timeout_s,
            stop_timeout_s=opts.provider_stop_timeout_s,
            crashes=CrashWindow(
                limit=opts.crash_loop_limit,
                window_s=opts.crash_loop_window_s,
                backoff_base_s=opts.restart_backoff_base_s,
                backoff_cap_s=opts.restart_backoff_cap_s,
            ),
            on_ready=lambda: self._fire("provider_ready"),
            on_lost=lambda: self._fire("provider_lost"),
            on_exited=self._provider_exited,
        )

    @property
    def adapter(self) -> Adapter:
        """The current adapter (the supervisor replaces it after a crash or a forced kill)."""
        return self.supervisor.adapter

    @property
    def provider_start_ms(self) -> float | None:
        return self.supervisor.start_ms

    # -- the adapter ---------------------------------------------------------------------------------
    def _new_adapter(self) -> Adapter:
        boot = self.boot
        provider_dir = Path(boot.session.state_dir) / "providers" / boot.execution.runtime
        provider_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        env = provider_env(boot.execution.environment, home=str(provider_dir / "home"), traceparent=boot.traceparent)
        (provider_dir / "home").mkdir(exist_ok=True, mode=0o700)
        config = AdapterConfig(
            session=boot.session,
            execution=boot.execution,
            state_dir=provider_dir,
            project_root=project_root(),
            traceparent=boot.traceparent,
            env=env,
        )
        return DeferredAdapter(config, self.ports)

    async def _provider_exited(self, adapter: Adapter) -> None:
        """The provider process exited on its own. During a run, its adapter normally raises
        provider.crashed (with its stderr tail) and the run path replaces it; if the adapter does not
        notice within a grace period, the kernel ends the run for it. While idle: replace it."""
        run = self.run
        if run is not None and run.adapter is adapter:
            if run.cancel_requested_by is None:
                with anyio.move_on_after(PROVIDER_EXIT_GRACE_S):
                    await run.ended.wait()
                if not run.ended.is_set() and run.terminal is None:
                    run.forced_error = ProviderError(
                        "provider.crashed",
                        "the provider process exited during the run",
                        retryable=True,
                        details={"stderr_tail": adapter.stderr_tail()},
                    )
                    run.scope.cancel()
            await run.ended.wait()
        else:
            await self.emit(
                "diagnostic.reported",
                {
                    "code": "provider.exited",
                    "severity": "warning",
                    "message": "the provider process exited while idle; restarting it",
                    "details": {"stderr_tail": adapter.stderr_tail()},
                },
            )
        # A no-op when the run path already replaced this adapter.
        self.supervisor.lost(adapter, "the provider exited", crashed=True)

    # -- the events port -----------------------------------------------------------------------------
    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        """The adapters' `emit`: validate, stamp with the run, admit to the outbox."""
        spec = EVENT_KINDS.get(kind)
        if spec is None:
            raise PayloadError(f"unknown event kind {kind!r}")
        run = self.run
        run_id: str | None = None
        if spec.run_scoped and kind not in ("host_tool.called",):
            if run is not None:
                if run.terminal is not None and kind not in RUN_TERMINALS:
                    log.debug("event.after_terminal_dropped", kind=kind, run_id=run.run_id)
                    return
                run_id = run.run_id
                run.last_activity = time.monotonic()
                if kind == "tool.started":
                    run.tools_started.setdefault(str(payload.get("tool_call_id")), str(payload.get("name", "")))
                elif kind == "tool.completed":
                    run.tools_completed.add(str(payload.get("tool_call_id")))
        elif kind == "host_tool.called":
            run_id = payload.get("run_id")
        body = validate_payload(kind, payload)
        if len(body) > MAX_PAYLOAD_BYTES:
            body = validate_payload(kind, _shrink(payload))
        await self.outbox.admit(kind, body, spec.delivery, run_id)

    async def _emit_for_run(self, run_id: str, kind: str, payload: dict[str, Any]) -> str:
        spec = EVENT_KINDS[kind]
        event_id = await self.outbox.admit(kind, validate_payload(kind, payload), spec.delivery, run_id)
        return event_id

    # -- states ---------------------------------------------------------------------------------------
    def _fire(self, trigger: Trigger) -> None:
        if self.state.can(trigger):
            self.state.fire(trigger)
        else:
            log.debug("state.ignored", trigger=trigger, state=self.state.state)

    def _permission_pending_changed(self, pending: int) -> None:
        self._fire("permission_pending" if pending else "permission_settled")

    # -- frames ---------------------------------------------------------------------------------------
    def hello(self) -> bytes:
        stats = self.outbox.snapshot()
        caps = [Capability(c, c in self.capabilities) for c in CAPABILITIES]
        return encode(
            Hello(
                protocol=PROTOCOL_VERSION,
                driver_instance_id=self.boot.driver_instance_id,
                epoch=self.epoch,
                driver_version=__version__,
                pid=os.getpid(),
                runtime=self.boot.execution.runtime,
                revision=self.boot.execution.revision,
                session_kind=self.boot.session.kind,
                capabilities=caps,
                last_command_seq=self.journal.last_command_seq(),
                outbox=OutboxSummary(stats.lossless_pending, stats.oldest_pending_seq),
                started_at=self.started_at_iso,
            )
        )

    def heartbeat(self) -> bytes:
        s = self.outbox.snapshot()
        state = self.state.state if self.state.state != "stopped" else "stopping"
        return encode(
            Heartbeat(
                at=utc_now(),
                state=state,  # type: ignore[arg-type]
                run_id=self.run.run_id if self.run else None,
                outbox=HeartbeatOutbox(
                    lossless_pending=s.lossless_pending,
                    best_effort_dropped=s.best_effort_dropped,
                    in_flight=s.in_flight,
                    oldest_pending_age_ms=s.oldest_pending_age_ms,
                    retries=s.retries,
                ),
            )
        )

    async def on_welcome(self, welcome: Welcome) -> None:
        pass

    async def on_final_rejections(self, finals: list[FinalRejection]) -> None:
        for f in finals:
            log.error(
                "event.rejected", event_id=f.event_id, kind=f.kind, code=f.rejection.code, message=f.rejection.message
            )
            if f.kind == "diagnostic.reported":
                continue  # never loop on a diagnostic about a diagnostic
            await self.emit(
                "diagnostic.reported",
                {
                    "code": "event.rejected",
                    "severity": "error",
                    "message": f"the control plane rejected {f.kind} {f.event_id}: {f.rejection.code}",
                    "details": {"event_id": f.event_id, "kind": f.kind, "reason": f.rejection.message},
                },
            )

    # -- commands -------------------------------------------------------------------------------------
    async def _send_update(self, update: CommandUpdate) -> None:
        if self._link is not None:
            await self._link.send(encode(update))

    async def _finish(
        self,
        command_id: str,
        seq: int,
        fingerprint: str,
        status: Literal["completed", "failed", "cancelled"],
        *,
        result: dict[str, Any] | None = None,
        error: CommandError | None = None,
    ) -> None:
        update = CommandUpdate(command_id=command_id, status=status, result=result, error=error)
        if status == "completed" and result is None:
            update.result = {}
        frame = encode(update)
        # Persist first: a terminal status must survive a restart before anyone can see it.
        await anyio.to_thread.run_sync(self.journal.save_command, command_id, seq, fingerprint, status, frame)
        self._in_progress.pop(command_id, None)
        await self._send_update(update)

    async def on_command(self, head: CommandFrame, raw: bytes) -> None:
        self._last_activity = time.monotonic()
        try:
            fingerprint = cmds.fingerprint(raw)
        except msgspec.DecodeError:
            return
        stored = self.journal.command(head.command_id)
        known = stored.fingerprint if stored is not None else self._in_progress.get(head.command_id)
        terminal = (
            stored.update_frame
            if stored is not None and stored.status in TERMINAL_STATUSES and stored.update_frame is not None
            else None
        )
        match cmds.classify_repeat(fingerprint, known, terminal):
            case cmds.Repeat.CONFLICT:
                await self._send_update(
                    CommandUpdate(
                        command_id=head.command_id,
                        status="failed",
                        error=CommandError("command.conflict", "this command_id was used before with other content"),
                    )
                )
                return
            case cmds.Repeat.RESEND_TERMINAL:
                assert terminal is not None
                if self._link is not None:
                    await self._link.send(terminal)
                return
            case cmds.Repeat.STILL_RUNNING:
                await self._send_update(CommandUpdate(command_id=head.command_id, status="accepted"))
                return
            case cmds.Repeat.NEW:
                pass
        # New command: accept at once (within 1 s), remember it, then execute.
        self._in_progress[head.command_id] = fingerprint
        await anyio.to_thread.run_sync(
            self.journal.save_command, head.command_id, head.seq, fingerprint, "accepted", None
        )
        await self._send_update(CommandUpdate(command_id=head.command_id, status="accepted"))
        try:
            command = cmds.decode_command(raw)
        except cmds.CommandInvalid as exc:
            await self._finish(
                head.command_id, head.seq, fingerprint, "failed", error=CommandError("command.invalid", str(exc))
            )
            return
        assert self._tg is not None
        self._tg.start_soon(self._execute, command, fingerprint)

    async def _execute(self, command: cmds.Command, fp: str) -> None:
        cid, seq = command.command_id, command.seq

        async def fail(code: str, message: str, retryable: bool = False) -> None:
            await self._finish(cid, seq, fp, "failed", error=CommandError(code, message, retryable))

        if self._stopping and not isinstance(command, cmds.SessionStop | cmds.PermissionResolve | cmds.HostToolResult):
            await fail("driver.stopping", "the driver is stopping", retryable=True)
            return
        match command:
            case cmds.InputStart():
                await self._input_start(command, fp)
            case cmds.TurnCancel():
                run = self.run
                if run is None or run.run_id != command.run_id or run.terminal is not None:
                    await self._finish(cid, seq, fp, "completed", result={"already_terminal": True})
                    return
                await self.cancel_run(run, requested_by="control_plane", reason=command.reason)
                await run.receipted.wait()
                await self._finish(
                    cid,
                    seq,
                    fp,
                    "completed",
                    result={"run_id": run.run_id, "terminal": run.terminal, "phase": run.cancel_phase},
                )
            case cmds.PermissionResolve():
                try:
                    self.permissions.resolve(command.request_id, command.option_id)
                except PermissionCommandError as exc:
                    await fail(exc.code, exc.message)
                    return
                await self._finish(cid, seq, fp, "completed")
            case cmds.HostToolResult():
                try:
                    self.host_tools.deliver(command.call_id, command.content, command.is_error)
                except HostToolCommandError as exc:
                    await fail(exc.code, exc.message)
                    return
                await self._finish(cid, seq, fp, "completed")
            case cmds.SessionReset():
                if self.run is not None:
                    await fail("driver.run_active", "a run is active; cancel it before a reset", retryable=True)
                    return
                try:
                    adapter = await self.supervisor.ready()
                    # A reset may respawn the provider process: that exit is ours, not a crash.
                    self.supervisor.unwatch()
                    try:
                        previous, current = await adapter.reset()
                    finally:
                        self.supervisor.rewatch()
                except ProviderError as exc:
                    await fail(exc.code, exc.message, exc.retryable)
                    return
                await self.emit("runtime.session.reset", {"previous": previous, "current": current})
                await self._finish(cid, seq, fp, "completed", result={"previous": previous, "current": current})
            case cmds.SessionStop():
                await self.stop(
                    reason=command.reason or "session.stop", requested_by="control_plane", command=(cid, seq, fp)
                )

    # -- runs -----------------------------------------------------------------------------------------
    async def _input_start(self, command: cmds.InputStart, fp: str) -> None:
        cid, seq = command.command_id, command.seq
        if self.run is not None:
            await self._finish(
                cid, seq, fp, "failed", error=CommandError("driver.run_active", "a run is already active", True)
            )
            return
        run = Run(command.run_id, cid)
        self.run = run
        self._fire("run_started")
        await anyio.to_thread.run_sync(self.journal.run_started, run.run_id, cid, utc_now())
        await self.emit(
            "run.started",
            {
                "run_id": run.run_id,
                "revision": self.boot.execution.revision,
                "input_summary": _summary(command.input.text),
            },
        )
        outcome: TurnOutcome | None = None
        error: ProviderError | None = None
        cwd = Path(self.boot.session.cwd)
        outputs_before = await anyio.to_thread.run_sync(artifacts.snapshot_outputs, cwd)
        run_input = command.input
        with run.scope:
            try:
                run_input = await self._prepare_input(command.input)
                adapter = await self.supervisor.ready()
                run.adapter = adapter
                run.last_activity = time.monotonic()
                silence = anyio.CancelScope()
                assert self._tg is not None
                self._tg.start_soon(self._watch_silence, run, adapter, silence)
                try:
                    outcome = await adapter.run(run.run_id, run_input)
                finally:
                    silence.cancel()
            except ProviderError as exc:
                error = exc
            except Exception as exc:
                log.exception("run.adapter_error", run_id=run.run_id)
                error = ProviderError("driver.internal", f"{type(exc).__name__}: {exc}")
        await self._report_artifacts(cwd, outputs_before)
        if outcome is None and error is None and run.forced_error is not None:
            error = run.forced_error
        if error is not None and error.code == "provider.crashed" and run.adapter is not None:
            error.details.setdefault("stderr_tail", run.adapter.stderr_tail())
        terminal_id = await self._end_run(run, outcome, error)
        status = _STATUS_OF[run.terminal or "run.failed"]
        self.outbox.watch(terminal_id)
        self.run = None
        self._fire("run_ended")
        attempt = self.supervisor.attempt
        if not attempt.done.is_set() or attempt.error is not None:
            # The provider is being replaced (or failed to start): say "starting", not "ready".
            self._fire("provider_lost")
        run.ended.set()
        self._last_activity = time.monotonic()
        if run.adapter is not None:
            if run.cancel_requested_by is not None and run.cancel_phase in ("terminate", "kill"):
                # We killed it (its adapter may call that a crash): restart for the next run, not a crash.
                reason = f"cancel reached {run.cancel_phase} in run {run.run_id}"
                self.supervisor.lost(run.adapter, reason, crashed=False)
            elif error is not None and error.code in ("provider.crashed", "provider.unresponsive"):
                self.supervisor.lost(run.adapter, f"{error.code} in run {run.run_id}", crashed=True)
        await self.outbox.receipted(terminal_id)
        run.receipted.set()
        result = {"run_id": run.run_id, "terminal_event_id": terminal_id}
        if status == "failed":
            err = error or ProviderError("provider.failed", "the run failed")
            if outcome is not None and outcome.status == "failed":
                err = ProviderError(outcome.error_code or "provider.failed", outcome.error_message or "the run failed")
            await self._finish(cid, seq, fp, "failed", error=CommandError(err.code, err.message, err.retryable))
        else:
            await self._finish(cid, seq, fp, status, result=result)

    async def _watch_silence(self, run: Run, adapter: Adapter, scope: anyio.CancelScope) -> None:
        """End the run as provider.unresponsive when its provider goes quiet for too long. Time spent
        waiting on the control plane (a pending permission or host tool call) does not count."""
        limit = self.options.provider_silence_timeout_s
        if limit <= 0:
            return
        with scope:
            while True:
                if self.permissions.pending_count or self.host_tools.pending_count or run.cancel_requested_by:
                    run.last_activity = time.monotonic()
                quiet = time.monotonic() - run.last_activity
                if quiet >= limit:
                    break
                await anyio.sleep(min(limit - quiet, 1.0) + 0.01)
        if scope.cancel_called:
            return
        log.error("run.provider_unresponsive", run_id=run.run_id, silent_s=round(quiet, 1))
        run.forced_error = ProviderError(
            "provider.unresponsive",
            f"the provider sent nothing for {limit:g} s during the run",
            retryable=True,
            details={"stderr_tail": adapter.stderr_tail()},
        )
        run.scope.cancel()

    async def _end_run(self, run: Run, outcome: TurnOutcome | None, error: ProviderError | None) -> str:
        """Choose the run's one terminal (driver.runs) and admit it. A cancel requested before this
        point wins."""
        for kind, payload in declined_tool_events(run, self.permissions.rejected_tool_calls):
            await self.emit(kind, payload)
        self.permissions.rejected_tool_calls.clear()
        kind, payload = choose_terminal(run, outcome, error, self.outbox.dropped_for_run(run.run_id))
        run.terminal = kind
        event_id = await self._emit_for_run(run.run_id, kind, payload)
        self.outbox.best_effort.forget_run(run.run_id)
        return event_id

    async def cancel_run(self, run: Run, *, requested_by: str, reason: str) -> None:
        """PROTOCOL §5: cancel permissions, interrupt, then SIGTERM and SIGKILL the provider if needed."""
        if run.terminal is not None or run.cancel_requested_by is not None:
            return
        run.cancel_requested_by = requested_by
        run.cancel_reason = reason
        self.permissions.cancel_all()
        assert self._tg is not None
        self._tg.start_soon(self._escalate, run)

    async def _escalate(self, run: Run) -> None:
        adapter = run.adapter
        if adapter is None:
            # The run is still waiting for its provider to (re)start: nothing to interrupt or signal
            # (the provider being started belongs to the next run), so end it now.
            run.scope.cancel()
            return
        # One deadline for asking and for waiting: a cancel() that hangs does not buy more time.
        deadline = anyio.current_time() + self.options.cancel_interrupt_grace_s
        try:
            with anyio.move_on_after(self.options.cancel_interrupt_grace_s):
                await adapter.cancel()
        except Exception as exc:
            log.warning("cancel.interrupt_failed", error=str(exc))
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            await run.ended.wait()
            return
        run.cancel_phase = "terminate"
        self._signal_provider(run, signal.SIGTERM)
        with anyio.move_on_after(self.options.cancel_term_grace_s):
            await run.ended.wait()
            return
        run.cancel_phase = "kill"
        self._signal_provider(run, signal.SIGKILL)
        with anyio.move_on_after(1.0):
            await run.ended.wait()
            return
        # The adapter did not return even with its provider dead: end the run without it.
        run.scope.cancel()

    def _signal_provider(self, run: Run, sig: int) -> None:
        adapter = run.adapter or self.adapter
        for pgid in self.supervisor.signal(adapter, sig):
            if pgid not in run.signalled_groups:
                run.signalled_groups.append(pgid)
        log.warning("cancel.signalled", run_id=run.run_id, signal=sig, groups=run.signalled_groups)

    # -- restart recovery ----------------------------------------------------------------------------
    async def recover(self) -> None:
        """End runs a dead predecessor left active; fail commands it left open (PROTOCOL §4.1)."""
        for run_id, command_id in self.journal.active_runs():
            if self.journal.has_terminal(run_id):
                continue
            event_id = await self._emit_for_run(
                run_id,
                "run.failed",
                {
                    "error": {
                        "code": "driver.restarted",
                        "message": "the driver process died while this run was active",
                        "retryable": True,
                        "details": None,
                    },
                    "dropped_best_effort": 0,
                },
            )
            self.outbox.watch(event_id)
            stored = self.journal.command(command_id)
            assert self._tg is not None
            self._tg.start_soon(self._finish_recovered, event_id, command_id, stored.seq if stored else 0, stored)
        for stored in self.journal.open_commands():
            if stored.command_id not in {c for _, c in self.journal.active_runs()}:
                await self._finish(
                    stored.command_id,
                    stored.seq,
                    stored.fingerprint,
                    "failed",
                    error=CommandError("driver.restarted", "the driver restarted before this command completed", True),
                )
        await self.outbox.flush()

    async def _finish_recovered(self, event_id: str, command_id: str, seq: int, stored: Any) -> None:
        await self.outbox.receipted(event_id)
        fp = stored.fingerprint if stored else ""
        await self._finish(
            command_id,
            seq,
            fp,
            "failed",
            error=CommandError("driver.restarted", "the driver process died while this run was active", True),
        )

    # -- stop ---------------------------------------------------------------------------------------
    async def stop(
        self,
        *,
        reason: str,
        requested_by: str,
        command: tuple[str, int, str] | None = None,
        drain: bool = True,
    ) -> None:
        """Cancel the active run, stop the provider, drain the outbox (bounded), then let serve() exit.

        `drain=False` is for a CP that terminated the instance (4410): it will store nothing more, so
        waiting for receipts would only delay the exit; the journal keeps what was not sent."""
        if self._stopping:
            if command is not None:
                await self._done.wait()
            return
        self._stopping = True
        self._fire("stop")
        log.info("driver.stopping", reason=reason, outbox=self.outbox.describe())
        run = self.run
        if run is not None:
            await self.cancel_run(run, requested_by=requested_by, reason=reason)
            await run.ended.wait()
        await self.supervisor.stop()
        await self.outbox.flush()
        drained = not drain  # nothing more can be delivered: what is journaled stays journaled
        if drain:
            with anyio.move_on_after(self.options.stop_drain_timeout_s):
                await self.outbox.drained()
                drained = True
        if command is not None:
            cid, seq, fp = command
            if drained:
                await self._finish(cid, seq, fp, "completed", result={"reason": reason})
            else:
                await self._finish(
                    cid,
                    seq,
                    fp,
                    "failed",
                    error=CommandError(
                        "driver.drain_timeout", f"{self.outbox.pending_count} events remain journaled", True
                    ),
                )
        if drained:
            self.exit_status = 0
        else:
            log.error("driver.drain_incomplete", remaining=self.outbox.pending_count)
            self.exit_status = EXIT_DRAIN_INCOMPLETE
        self._fire("stopped")
        self._done.set()

    # -- main ---------------------------------------------------------------------------------------
    async def serve(self) -> int:
        from driver.link import Link, LinkHooks

        link = Link(
            self.boot.control,
            self.boot.driver_instance_id,
            self.outbox,
            LinkHooks(
                hello=self.hello,
                heartbeat=self.heartbeat,
                on_welcome=self.on_welcome,
                on_command=self.on_command,
                on_final_rejections=self.on_final_rejections,
            ),
        )
        self._link = link
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self.supervisor.bind(tg)
            tg.start_soon(self.outbox.run)
            await self.recover()
            tg.start_soon(self._boot_provider)
            tg.start_soon(self._watch_link, link)
            tg.start_soon(self._watch_signals)
            tg.start_soon(self._idle_exit)
            await self._done.wait()
            # Flush the journal and say goodbye before leaving.
            with anyio.CancelScope(shield=True):
                await self.outbox.flush()
                with anyio.move_on_after(2):
                    await link.close(1000, "driver exiting")
            tg.cancel_scope.cancel()
        self.journal.close()
        return self.exit_status if self.exit_status is not None else 0

    async def _prepare_input(self, run_input: cmds.RunInput) -> cmds.RunInput:
        """Download attachments into cwd/inputs/ and tell the provider where they are (in the prompt,
        the one channel every runtime reads)."""
        if not run_input.attachments:
            return run_input
        cwd = Path(self.boot.session.cwd)
        try:
            for att in run_input.attachments:
                self.files.admit(artifacts.attachment_path(cwd, att.name))
            saved = await artifacts.download_attachments(cwd, run_input.attachments)
        except (artifacts.AttachmentError, PathNotAllowed) as exc:
            raise ProviderError("input.attachment_invalid", str(exc)) from None
        listing = ", ".join(f"{p.relative_to(cwd)} ({a.size} bytes)" for a, p in saved)
        return cmds.RunInput(text=f"{run_input.text}\n\n[Attached files, in the working directory: {listing}]")

    async def _report_artifacts(self, cwd: Path, before: dict[str, artifacts.FileState]) -> None:
        try:
            changed = await anyio.to_thread.run_sync(artifacts.changed_outputs, cwd, before)
        except OSError as exc:
            log.warning("artifacts.scan_failed", error=str(exc))
            return
        for rel, size, digest in changed:
            await self.emit("artifact.produced", {"path": rel, "size": size, "sha256": digest})

    async def _install_skills(self) -> None:
        if not self.boot.execution.skills:
            return
        from driver.ports import skills  # zipfile and friends: only when there are skills to install

        cwd = Path(self.boot.session.cwd)
        for skill in self.boot.execution.skills:
            try:
                installed = await skills.install(skill, cwd)
                log.info("skill.installed", name=skill.name, path=str(installed.path))
            except skills.SkillError as exc:
                await self.emit(
                    "diagnostic.reported",
                    {
                        "code": "skill.failed",
                        "severity": "warning",
                        "message": f"skill {skill.name!r} was not installed: {exc}",
                        "details": {"name": skill.name},
                    },
                )

    async def _boot_provider(self) -> None:
        await self._install_skills()
        await self.supervisor.boot()
        timings = {
            "boot_ms": round((time.monotonic() - self.started_monotonic) * 1000, 1),
            "provider_start_ms": round(self.provider_start_ms, 1) if self.provider_start_ms is not None else None,
        }
        await self.emit(
            "driver.started",
            {
                "epoch": self.epoch,
                "revision": self.boot.execution.revision,
                "runtime": self.boot.execution.runtime,
                "capabilities": [{"id": c, "supported": c in self.capabilities} for c in CAPABILITIES],
                "timings": timings,
            },
        )

    async def _watch_link(self, link: Any) -> None:
        reaction: CloseReaction = await link.run()
        log.warning("link.fatal", reason=reaction.reason, exit_status=reaction.exit_status)
        if reaction.exit_status == 0:
            await self.stop(reason=reaction.reason, requested_by="control_plane", drain=False)
            return
        # Fatal: stop providers and exit with the table's status; the journal keeps what is unsent.
        self._stopping = True
        with anyio.CancelScope(shield=True):
            await self.supervisor.stop()
        self.exit_status = reaction.exit_status
        self._done.set()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                if self._stopping:
                    # Second signal: exit at once after flushing the journal.
                    log.warning("driver.signal_exit", signal=signum)
                    # No orphans: the provider groups go at once, not after their grace periods.
                    self.supervisor.kill_now()
                    with anyio.CancelScope(shield=True):
                        await self.outbox.flush()
                    self.exit_status = 128 + signum
                    self._done.set()
                    return
                assert self._tg is not None
                self._tg.start_soon(lambda: self.stop(reason="signal", requested_by="signal"))

    async def _idle_exit(self) -> None:
        session = self.boot.session
        if session.kind != "cattle" or session.idle_exit_ms is None:
            return
        limit = session.idle_exit_ms / 1000.0
        while not self._stopping:
            idle_for = time.monotonic() - self._last_activity
            if self.run is None and idle_for >= limit:
                log.info("driver.idle_exit", idle_ms=int(idle_for * 1000))
                await self.stop(reason="idle", requested_by="driver")
                return
            await anyio.sleep(max(0.05, limit - idle_for if self.run is None else limit))


_STATUS_OF: dict[str, Literal["completed", "failed", "cancelled"]] = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
}


def _summary(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _shrink(payload: dict[str, Any], budget: int = MAX_PAYLOAD_BYTES // 2) -> dict[str, Any]:
    """Cut oversized string fields so an event fits a frame; says how much was cut."""
    out: dict[str, Any] = {}
    for key, value in payload.items():
        if isinstance(value, str) and len(value) > budget // 4:
            cut = len(value) - budget // 4
            out[key] = value[: budget // 4] + f"…[truncated {cut} chars]"
        else:
            out[key] = value
    return out
