"""The `Kernel`: one driver instance's shared state and the wiring between its rooms.

One process serves one driver instance. The kernel owns the journal and outbox, the supervisor and
its adapter, the ports and the link; the events port (`emit`) stamps events with the active run and
admits them (the decision is `admission.judge`). The rooms hold the behaviour: `commands.CommandDesk`,
`runpath.RunPath`, `provider.ProviderRoom` and `lifecycle.Lifecycle`; `announce` builds what the
driver says about itself (its capabilities, `hello`, `heartbeat`).
"""

from __future__ import annotations

import gc
import os
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from driver import guard, logs, tasks
from driver.kernel import admission, announce
from driver.kernel.options import KernelOptions, project_root
from driver.kernel.states import StateMachine, Trigger
from driver.kernel.tamper import TamperReports
from driver.protocol import paths
from driver.protocol.boot import BootPayload
from driver.protocol.events import (
    DEFAULT_MAX_EVENT_BYTES,
    EVENT_KINDS,
    PayloadError,
    event_limit,
    fit_payload,
)
from driver.protocol.frames import (
    CommandFrame,
    InvalidCommand,
    Welcome,
    encode,
)
from driver.queue.command_index import StoredCommand
from driver.queue.journal import Journal
from driver.queue.outbox import FinalRejection, Outbox, utc_now
from driver.queue.rowmac import RowMac, derive_key

if TYPE_CHECKING:
    # The rooms are imported by `driver.kernel.rooms` once the first hello is out (see `serve`).
    from driver.adapters.common.base import Adapter, Ports
    from driver.checkpoints.recorder import Checkpointer
    from driver.kernel.commands import CommandDesk
    from driver.kernel.lifecycle import Lifecycle
    from driver.kernel.provider import ProviderRoom
    from driver.kernel.runpath import RunPath
    from driver.kernel.runs import Run
    from driver.kernel.supervisor import ProviderSupervisor
    from driver.net.link import Link
    from driver.ports.files import AllowedRoots
    from driver.ports.host_tools import HostToolBroker
    from driver.ports.permissions import PermissionBroker
    from driver.processes.room import ProcessRoom
    from driver.protocol.link import CloseReaction
    from driver.telemetry.room import TelemetryRoom

log = logs.get("driver.kernel")

# The exit status when a task the driver cannot run without failed (EX_SOFTWARE, as the README's
# "stopped with events still journaled": the journal keeps what was not sent).
EXIT_INTERNAL = 70

# How long the rooms wait for the first dial to end before they are built anyway (see `serve`).
HELLO_FIRST_S = 0.25
# How long the last flush of the outbox may take on the way out (a disk that hangs must not hold the exit).
FINAL_FLUSH_S = 10.0

# Events the provider room watches: they move the current native ref or the transcript.
_OBSERVED = frozenset({"runtime.resume.updated", "runtime.session.reset", "message.completed"})
# Events that name a file: its name may not be UTF-8 (driver.protocol.paths).
_NAMED = frozenset({"file.changed", "artifact.produced"})


class Kernel:
    """Built in two steps. The constructor opens what the first `hello` needs (the journal, this
    process's epoch, the outbox, the state machine). `assemble` imports and builds the rest (ports,
    rooms, supervisor, telemetry). `serve` dials first and assembles once that `hello` is out, so the
    control plane hears from a new driver before tens of milliseconds of imports and the provider's
    spawn. `assemble=True` builds all at once, for benches that drive a kernel's parts without
    `serve` (its hooks then never wait for restart recovery: do not `serve` such a kernel)."""

    # Built by `assemble` (driver/kernel/rooms.py).
    permissions: PermissionBroker
    host_tools: HostToolBroker
    files: AllowedRoots
    ports: Ports
    commands: CommandDesk
    runs: RunPath
    provider: ProviderRoom
    lifecycle: Lifecycle
    checkpoints: Checkpointer
    telemetry: TelemetryRoom
    supervisor: ProviderSupervisor
    processes: ProcessRoom

    def __init__(
        self,
        boot: BootPayload,
        *,
        started_at: float,
        options: KernelOptions | None = None,
        assemble: bool = False,
    ) -> None:
        self.boot = boot
        self.options = options or KernelOptions.from_env(os.environ)
        self.project_root = project_root()
        self.started_monotonic = started_at
        self.started_at_iso = utc_now()
        self.state = StateMachine()
        state_dir = Path(boot.session.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Journal rows are authenticated under a key derived from the token (PROTOCOL §9), held only here.
        self.journal = Journal(
            state_dir / "driver" / "journal.sqlite3",
            mac=RowMac(derive_key(boot.control.token, boot.driver_instance_id)),
        )
        self.epoch = self.journal.bump_epoch()
        self.outbox = Outbox(
            self.journal,
            boot.driver_instance_id,
            boot.session.id,
            self.epoch,
            max_events=self.options.outbox_max_events,
            max_bytes=self.options.outbox_max_bytes,
        )
        self.tamper_reports = TamperReports(self)
        self.run: Run | None = None
        self.exit_status: int | None = None
        self.left_journaled = 0  # lossless events a stop left unsent (exit 70): the CLI's last line says so
        self.done = anyio.Event()
        self.assembled = anyio.Event()  # the rooms are built
        self.ready = anyio.Event()  # ... and recovery is done: the link's hooks may go on
        self.last_activity = time.monotonic()
        self.stopping = False
        self.handed_over = False  # set by a handover (driver/kernel/keep.py): this process emits no more
        self.link: Link | None = None
        self.max_event_bytes = DEFAULT_MAX_EVENT_BYTES  # until a welcome says otherwise (§4.3)
        self._tg: tasks.Tasks | None = None  # the process's supervision boundary (driver.tasks)
        self._hello_at: float | None = None  # when the first hello went out, for the telemetry room
        # Static: `hello` is built before the adapter's module (and its SDK) is imported.
        self.capabilities = announce.stated_capabilities(boot)
        if assemble:
            self.assemble()
            self.ready.set()  # no `serve`-driven start: nothing to wait for

    def assemble(self) -> None:
        """Import and build the ports, the rooms, the supervisor and the telemetry room."""
        if self.assembled.is_set():
            return
        from driver.kernel import rooms

        rooms.assemble(self)
        if self._hello_at is not None:
            self.telemetry.hello_sent(at=self._hello_at)
        self.assembled.set()

    @property
    def adapter(self) -> Adapter:
        """The current adapter (the supervisor replaces it after a crash or a forced kill)."""
        return self.supervisor.adapter

    @property
    def provider_start_ms(self) -> float | None:
        return self.supervisor.start_ms

    def capability_list(self) -> list[dict[str, Any]]:
        return announce.capability_entries(self.boot.execution.runtime, self.capabilities)

    def capability_mode(self, capability: str) -> str | None:
        return announce.mode_of(self.boot.execution.runtime, self.capabilities, capability)

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start a task in the kernel's task group (alive for the process's life). An unexpected
        exception ends that task only, reported (driver.kernel.guard), never the task group."""
        assert self._tg is not None
        self._tg.spawn(fn, *args)

    def spawn_contained(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Start a task that is its own supervision boundary (it catches and reports its errors); guarded
        all the same, so a bug in its own boundary ends that task, not the process."""
        assert self._tg is not None
        self._tg.spawn(fn, *args)

    def touch(self) -> None:
        """Something happened: the idle clock starts again."""
        self.last_activity = time.monotonic()

    def provider_ready(self) -> None:
        self.fire("provider_ready")
        self.provider.on_ready()

    # -- the events port -----------------------------------------------------------------------------
    async def emit(self, kind: str, payload: dict[str, Any], *, status: StoredCommand | None = None) -> str | None:
        """The adapters' `emit`: validate, stamp with the run, admit to the outbox. Returns the
        event_id (None for an event dropped because its run is already terminal). `status`: the
        command status this event (`command.finished`) is the fact of, journaled with it (§4.1)."""
        spec = EVENT_KINDS.get(kind)
        if spec is None:
            raise PayloadError(f"unknown event kind {kind!r}")
        if self.handed_over:
            return None  # PROTOCOL §8.2: the successor derives these again from the keeper's log
        run = self.run
        verdict = admission.judge(kind, spec, payload, run)
        if not verdict.admitted:
            if verdict.count_drop:
                self.outbox.best_effort.count_drop(verdict.run_id)
            elif verdict.dropped == "after_terminal" and run is not None:
                log.debug("event.after_terminal_dropped", kind=kind, run_id=run.run_id)
            return None
        run_id = verdict.run_id
        if kind in _NAMED:
            payload = paths.carry(payload)  # PROTOCOL §9: a name that is not UTF-8, escaped
        if kind in _OBSERVED:
            await self.provider.observe(kind, payload)
        self.telemetry.observe(kind, payload)
        # PROTOCOL §4.3: cut to fit before admission, so no event can wedge the link.
        body = fit_payload(kind, paths.validated(kind, payload), self.max_event_bytes)
        return await self.outbox.admit(kind, body, spec.delivery, run_id, status)

    # -- states ---------------------------------------------------------------------------------------
    def fire(self, trigger: Trigger) -> None:
        if self.state.can(trigger):
            self.state.fire(trigger)
        else:
            log.debug("state.ignored", trigger=trigger, state=self.state.state)

    def permission_pending_changed(self, pending: int) -> None:
        self.fire("permission_pending" if pending else "permission_settled")

    # -- frames ---------------------------------------------------------------------------------------
    def hello(self) -> bytes:
        stats = self.outbox.snapshot()
        if self.assembled.is_set():
            self.telemetry.hello_sent()
        elif self._hello_at is None:
            self._hello_at = time.monotonic()  # given to the telemetry room when it is built
        frame = announce.hello(
            self.boot,
            epoch=self.epoch,
            supported=self.capabilities,
            last_command_seq=self.journal.last_command_seq(),
            stats=stats,
            started_at=self.started_at_iso,
        )
        return encode(frame)

    def heartbeat(self) -> bytes:
        assembled = self.assembled.is_set()
        frame = announce.heartbeat(
            self.state.state,
            run_id=self.run.run_id if self.run else None,
            stats=self.outbox.snapshot(),
            activity=self.telemetry.heartbeat_activity() if assembled else None,
            queued=self.runs.queue.run_ids() if assembled else [],
            processes=self.processes.heartbeat() if assembled else [],
        )
        return encode(frame)

    # The link may deliver these before the rooms are built and recovery is done (it starts first):
    # each waits, which holds the link's reader for those few milliseconds, never longer.
    async def on_welcome(self, welcome: Welcome) -> None:
        self.max_event_bytes = event_limit(welcome)  # the welcome's values are bounded (protocol.welcome)
        await self.ready.wait()
        try:
            self.telemetry.on_welcome()
        except Exception as exc:
            await guard.report(self, "welcome", exc)

    async def on_command(self, head: CommandFrame | InvalidCommand, raw: bytes) -> None:
        await self.ready.wait()
        await self.commands.on_command(head, raw)  # its own boundary: never raises

    def on_final_rejections(self, finals: list[FinalRejection]) -> None:
        """From the link's reader or sender: never waits there. Reporting admits diagnostics into the
        outbox, which may be full, and only the sender can empty it (issue 19: the link waited on
        itself), so the reports are admitted by a task of their own."""
        if not finals:
            return
        if self._tg is None:  # a bench's kernel that never served: nothing to report through
            log.error("event.rejected_unreported", count=len(finals))
            return
        self.spawn(self._report_rejections, finals)

    async def _report_rejections(self, finals: list[FinalRejection]) -> None:
        await self.ready.wait()
        try:
            await self._final_rejections(finals)
        except Exception as exc:
            await guard.report(self, "final rejections", exc)

    async def _final_rejections(self, finals: list[FinalRejection]) -> None:
        for f in finals:
            log.error(
                "event.rejected", event_id=f.event_id, kind=f.kind, code=f.rejection.code, message=f.rejection.message
            )
            if f.kind == "diagnostic.reported":
                continue  # never loop on a diagnostic about a diagnostic
            if f.kind == "host_tool.called":
                self.host_tools.rejected(f.event_id)
            elif f.kind.startswith("checkpoint."):
                self.checkpoints.forget()  # §8.1: the next checkpoint sends whole files
            await self.emit(
                "diagnostic.reported",
                {
                    "code": "event.rejected",
                    "severity": "error",
                    "message": f"the control plane rejected {f.kind} {f.event_id}: {f.rejection.code}",
                    "details": {"event_id": f.event_id, "kind": f.kind, "reason": f.rejection.message},
                },
            )

    async def stop(self, *, reason: str, requested_by: str, drain: bool = True) -> None:
        await self.lifecycle.stop(reason=reason, requested_by=requested_by, drain=drain)

    # -- main ---------------------------------------------------------------------------------------
    async def serve(self) -> int:
        """The process's life; on every way out (an exception included) what was admitted to the
        outbox is journaled before the journal closes (issue 30: a diagnostic admitted just before
        an internal error was lost)."""
        try:
            return await self._serve()
        finally:
            await self._final_flush()
            self.journal.close()

    async def _final_flush(self) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(FINAL_FLUSH_S):
            try:
                await self.outbox.flush()
            except Exception as exc:  # the journal itself failed: the log is all that is left
                log.error("outbox.final_flush_failed", error_type=type(exc).__name__, exc_info=True)

    async def _serve(self) -> int:
        from driver.net.link import Link, LinkHooks

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
        self.link = link
        async with tasks.boundary("kernel", self) as tg:
            self._tg = tg
            tg.essential("outbox", self.outbox.run, self._exit_internal)
            tg.keep("link", lambda: self._watch_link(link))
            tg.keep("tamper reports", self.tamper_reports.run)
            # The hello first: the rooms' imports and the provider's spawn hold the loop for tens of
            # ms, the dial needs it for a few. Bounded, so a control plane that does not answer (a
            # dial that hangs rather than fails) never holds the driver back long.
            with anyio.move_on_after(HELLO_FIRST_S):
                await link.first_dial_done.wait()
            self.assemble()
            self.supervisor.bind(tg)
            await self.lifecycle.recover()
            # §8.1: before any command can start the provider, which must find the restored session.
            await self.provider.restore_checkpoint()
            self.ready.set()
            if not gc.isenabled():
                # `agent-driver run` starts with the collector off (fewer pauses on the way to
                # hello). What the start built lives as long as the process: frozen, the
                # collector never walks it again.
                gc.freeze()
                gc.enable()
            self.spawn(self.provider.boot)
            # Long-lived: restarted when they fail (each holds no state a restart could lose).
            tg.keep("signals", self._watch_signals)
            tg.keep("idle_exit", self.lifecycle.idle_exit)
            tg.keep("telemetry", self.telemetry.run)
            await self.done.wait()
            # Flush the journal and say goodbye before leaving.
            with anyio.CancelScope(shield=True):
                await self.telemetry.shutdown()
                await self.outbox.flush()
                with anyio.move_on_after(2):
                    await link.close(1000, "driver exiting")
            tg.cancel()
        return self.exit_status if self.exit_status is not None else 0

    async def _exit_internal(self) -> None:
        self.stopping = True
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.options.provider_stop_timeout_s):
            if self.assembled.is_set():
                await self.supervisor.stop()
        self.exit_status = EXIT_INTERNAL
        self.done.set()

    async def _watch_link(self, link: Link) -> None:
        reaction: CloseReaction = await link.run()
        await self.ready.wait()
        log.warning("link.fatal", reason=reaction.reason, exit_status=reaction.exit_status)
        if reaction.exit_status == 0:
            await self.stop(reason=reaction.reason, requested_by="control_plane", drain=False)
            return
        # Fatal: stop providers and exit with the table's status; the journal keeps what is unsent.
        self.stopping = True
        self.processes.kill_now()
        with anyio.CancelScope(shield=True):
            await self.supervisor.stop()
        self.exit_status = reaction.exit_status
        self.done.set()

    async def _watch_signals(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGUSR2) as signals:
            async for signum in signals:
                if signum == signal.SIGUSR2 and not self.stopping:
                    from driver.kernel import keep

                    self.spawn(keep.handover, self)  # PROTOCOL §8.2: a successor takes the provider
                    continue
                if self.stopping:
                    # Second signal: exit at once after flushing the journal.
                    log.warning("driver.signal_exit", signal=signum)
                    # No orphans: the provider groups go at once, not after their grace periods.
                    self.supervisor.kill_now()
                    self.processes.kill_now()
                    with anyio.CancelScope(shield=True):
                        await self.outbox.flush()
                    self.exit_status = 128 + signum
                    self.done.set()
                    return
                self.spawn(lambda: self.stop(reason="signal", requested_by="signal"))

