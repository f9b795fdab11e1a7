"""Command dispatch (PROTOCOL §3): idempotency by `command_id`, `accepted` at once, exactly one terminal
status, and every terminal status kept as a fact.

A terminal status and its lossless `command.finished` event (journaled and retried like every lossless
event, so a status produced while the link is down or during recovery still reaches the control plane)
are journaled in ONE transaction by the outbox's one writer (PROTOCOL §4.1), and only then is the fast
`command.update` frame sent when a link is up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import anyio
import anyio.lowlevel
import msgspec

from driver import guard, logs
from driver.adapters.common.base import ProviderError
from driver.kernel import run_ids
from driver.ports.host_tools import HostToolCommandError
from driver.ports.permissions import PermissionCommandError
from driver.protocol import commands as cmds
from driver.protocol.fingerprint import comparable
from driver.protocol.frames import (
    TERMINAL_STATUSES,
    CommandError,
    CommandFrame,
    CommandUpdate,
    InvalidCommand,
    encode,
)
from driver.queue.command_index import StoredCommand

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.kernel.commands")

TerminalStatus = Literal["completed", "failed", "cancelled"]
RESOLVED_WAIT_S = 10.0  # how long a permission.resolve waits for its permission.resolved to be admitted


class CommandDesk:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.in_progress: dict[str, str] = {}  # command_id → fingerprint, for commands not yet terminal
        self.kinds: dict[str, str] = {}  # command_id → kind, for command.finished
        self._started: anyio.Event | None = None  # set once the latest accepted command began executing
        self.run_ids = run_ids.RunIds(kernel)  # PROTOCOL §9: an input.start's run_id is used once

    async def send_update(self, update: CommandUpdate) -> None:
        link = self.k.link
        if link is not None:
            await link.send(encode(update))

    async def finish(
        self,
        command_id: str,
        seq: int,
        fingerprint: str,
        status: TerminalStatus,
        *,
        result: dict[str, Any] | None = None,
        error: CommandError | None = None,
        kind: str | None = None,
    ) -> None:
        """Journal the terminal status with its `command.finished` (one transaction), then send the
        fast update."""
        update = CommandUpdate(command_id=command_id, status=status, result=result, error=error)
        if status == "completed" and result is None:
            update.result = {}
        frame = encode(update)
        command_kind = kind or self.kinds.get(command_id) or self.k.journal.command_kind(command_id) or ""
        finished: dict[str, Any] = {"command_id": command_id, "command_kind": command_kind, "status": status}
        if error is not None:
            finished["error"] = {"code": error.code, "message": error.message, "retryable": error.retryable}
        else:
            finished["result"] = update.result
        stored = StoredCommand(command_id, seq, fingerprint, status, frame)
        # Durable before anyone can see it, and together with its fact: no crash leaves one without the
        # other, and `last_command_seq` counts the command only once both are on disk.
        try:
            await self.k.emit("command.finished", finished, status=stored)
        except ValueError as exc:  # the fact could not be built (a payload bug): the status alone
            log.error("command.finished_unbuildable", command_id=command_id, error=type(exc).__name__)
            await self.k.outbox.save_status(stored)
        self.in_progress.pop(command_id, None)
        self.kinds.pop(command_id, None)
        await self.send_update(update)

    async def on_command(self, head: CommandFrame | InvalidCommand, raw: bytes) -> None:
        """A command frame from the link's reader. Never raises: an unexpected error fails the command."""
        if isinstance(head, InvalidCommand):
            await self.invalid_head(head)
            return
        try:
            await self._on_command(head, raw)
        except Exception as exc:
            try:
                fp: str | None = cmds.fingerprint(raw)
            except Exception:
                fp = None
            await self.internal_error(head.command_id, head.seq, head.kind, exc, fp)

    async def invalid_head(self, head: InvalidCommand) -> None:
        """A command frame whose `command_id` is readable but whose head is not (a `seq` outside int64,
        no `kind`): answered at once, `failed` / `command.invalid`, and not journaled, since its `seq`
        cannot be stored or counted (PROTOCOL §3, §9; docs/protocol.md). An id already in use keeps its
        own status: this other content under it is a `command.conflict`."""
        try:
            known = head.command_id in self.in_progress or self.k.journal.command(head.command_id) is not None
            if known:
                error = CommandError("command.conflict", "this command_id was used before with other content")
            else:
                error = CommandError("command.invalid", head.problem)
            await self.send_update(CommandUpdate(command_id=head.command_id, status="failed", error=error))
        except Exception as exc:
            await guard.report(self.k, "command (invalid)", exc, command_id=head.command_id)

    async def internal_error(
        self, command_id: str, seq: int, kind: str, exc: BaseException, fp: str | None = None
    ) -> None:
        """The supervision boundary for one command: reported, and failed `driver.internal_error`
        unless it already has its terminal status (then the status stands: exactly one)."""
        await guard.report(self.k, f"command {kind}", exc, command_id=command_id)
        try:
            stored = self.k.journal.command(command_id)
            if stored is not None and stored.status in TERMINAL_STATUSES:
                return
            known = self.in_progress.get(command_id) or (stored.fingerprint if stored is not None else None)
            error = CommandError(guard.INTERNAL_ERROR, guard.error_message(f"command {kind}", exc))
            await self.finish(command_id, seq, known or fp or "", "failed", error=error, kind=kind)
        except Exception as again:
            # Even the failure could not be stored: the CP resends the command after the next welcome.
            await guard.report(self.k, f"command {kind} (failing it)", again, command_id=command_id)

    async def _on_command(self, head: CommandFrame, raw: bytes) -> None:
        k = self.k
        k.touch()
        try:
            fingerprint = cmds.fingerprint(raw)
        except msgspec.DecodeError as exc:  # readable as a head, not as content: still answered
            await self.invalid_head(InvalidCommand(head.command_id, str(exc)))
            return
        stored = k.journal.command(head.command_id)
        known = stored.fingerprint if stored is not None else self.in_progress.get(head.command_id)
        terminal = (
            stored.update_frame
            if stored is not None and stored.status in TERMINAL_STATUSES and stored.update_frame is not None
            else None
        )
        # A status stored by an older driver holds an older kind of fingerprint: compared in kind.
        match cmds.classify_repeat(comparable(raw, fingerprint, known), known, terminal):
            case cmds.Repeat.CONFLICT:
                await self.send_update(
                    CommandUpdate(
                        command_id=head.command_id,
                        status="failed",
                        error=CommandError("command.conflict", "this command_id was used before with other content"),
                    )
                )
                return
            case cmds.Repeat.RESEND_TERMINAL:
                assert terminal is not None
                if k.link is not None:
                    await k.link.send(terminal)
                return
            case cmds.Repeat.STILL_RUNNING:
                await self.send_update(CommandUpdate(command_id=head.command_id, status="accepted"))
                return
            case cmds.Repeat.NEW:
                pass
        # New command: accept at once (within 1 s), remember it, then execute.
        self.in_progress[head.command_id] = fingerprint
        self.kinds[head.command_id] = head.kind
        # In a task, so the link's reader goes on to the next frame: the `accepted` writes of a burst
        # share one commit, and a flood of commands cannot queue a run's input.start behind its fsyncs.
        # Commands still begin executing in arrival order (a turn.cancel right behind its input.start
        # must find the run): each waits for its predecessor to have started.
        previous, self._started = self._started, anyio.Event()
        k.spawn_contained(self.accept, head, raw, fingerprint, previous, self._started)

    async def accept(
        self, head: CommandFrame, raw: bytes, fingerprint: str, previous: anyio.Event | None, started: anyio.Event
    ) -> None:
        """Its own boundary (spawned unguarded: a flood holds thousands of these at once, each one
        frame, not three)."""
        try:
            accepted = StoredCommand(head.command_id, head.seq, fingerprint, "accepted", None, head.kind)
            await self.k.outbox.save_status(accepted)
            await self.send_update(CommandUpdate(command_id=head.command_id, status="accepted"))
            try:
                command = cmds.decode_command(raw)
            except cmds.CommandInvalid as exc:
                await self.finish(
                    head.command_id, head.seq, fingerprint, "failed", error=CommandError("command.invalid", str(exc))
                )
                return
            await self._after(previous)
            self.k.spawn(self.execute, command, fingerprint)
            # Let it run to its first wait (registering a run, say) before the next command starts.
            await anyio.lowlevel.checkpoint()
        except Exception as exc:
            await self.internal_error(head.command_id, head.seq, head.kind, exc, fingerprint)
        finally:
            with anyio.CancelScope(shield=True):
                await self._after(previous)  # the chain holds even for a command that did not execute
            started.set()

    @staticmethod
    async def _after(previous: anyio.Event | None) -> None:
        if previous is not None:
            await previous.wait()

    async def execute(self, command: cmds.Command, fp: str) -> None:
        try:
            await self._execute(command, fp)
        except Exception as exc:
            kind = str(type(command).__struct_config__.tag)
            await self.internal_error(command.command_id, command.seq, kind, exc, fp)

    async def _execute(self, command: cmds.Command, fp: str) -> None:
        k = self.k
        cid, seq = command.command_id, command.seq

        async def fail(code: str, message: str, retryable: bool = False) -> None:
            await self.finish(cid, seq, fp, "failed", error=CommandError(code, message, retryable))

        if cid in k.journal.set_aside_commands:
            # Its journaled status failed the MAC check (PROTOCOL §9): it may have run already, and
            # whatever the row claimed is not trusted, so it is neither executed again nor answered from
            # the row. The CP learns it through this failed status (and the journal.tampered report).
            await fail("journal.tampered", "this command's journaled status failed its check; it is not run again")
            return
        if k.stopping and not isinstance(command, cmds.SessionStop | cmds.PermissionResolve | cmds.HostToolResult):
            await fail("driver.stopping", "the driver is stopping", retryable=True)
            return
        match command:
            case cmds.InputStart():
                if not self.run_ids.claim(command.run_id):
                    await fail(run_ids.DUPLICATE, f"run {command.run_id} was already run or is held: one run per id")
                    return
                taken = False
                try:
                    taken = await k.runs.input_start(command, fp)
                finally:
                    if not taken:
                        self.run_ids.release(command.run_id)
            case cmds.InputSteer():
                await k.runs.steering.steer(command, fp)
            case cmds.TurnCancel():
                run = k.run
                if k.runs.queue.find(command.run_id) is not None:
                    # PROTOCOL §3.1: a queued run ends run.cancelled{phase: queued}, never started.
                    event_id = await k.runs.queue.cancel(
                        command.run_id, requested_by="control_plane", reason=command.reason
                    )
                    if event_id is not None:
                        await k.outbox.receipted(event_id)
                    result = {"run_id": command.run_id, "terminal": "run.cancelled", "phase": "queued"}
                    await self.finish(cid, seq, fp, "completed", result=result)
                    return
                if run is None or run.run_id != command.run_id or run.terminal is not None:
                    await self.finish(cid, seq, fp, "completed", result={"already_terminal": True})
                    return
                await k.runs.cancel_run(run, requested_by="control_plane", reason=command.reason)
                await run.receipted.wait()
                await self.finish(
                    cid,
                    seq,
                    fp,
                    "completed",
                    result={"run_id": run.run_id, "terminal": run.terminal, "phase": run.cancel_phase},
                )
            case cmds.PermissionResolve():
                try:
                    announced = k.permissions.resolve(command.request_id, command.option_id)
                except PermissionCommandError as exc:
                    await fail(exc.code, exc.message)
                    return
                # The decision's permission.resolved is admitted first: by the prefix rule (§4.1) this
                # status is then never durable without it, so a successor never waits on a request the
                # CP believes answered (§8.2). Bounded: the outbox's backpressure cannot hold the desk.
                with anyio.move_on_after(RESOLVED_WAIT_S):
                    await announced.wait()
                await self.finish(cid, seq, fp, "completed")
            case cmds.HostToolResult():
                try:
                    k.host_tools.deliver(command.call_id, command.content, command.is_error)
                except HostToolCommandError as exc:
                    await fail(exc.code, exc.message)
                    return
                await self.finish(cid, seq, fp, "completed")
            case cmds.SessionReset():
                await k.runs.queue.cancel_all(requested_by="control_plane", reason=command.reason or "session.reset")
                try:
                    previous, current = await k.provider.reset_session()
                except ProviderError as exc:
                    await fail(exc.code, exc.message, exc.retryable)
                    return
                await self.finish(cid, seq, fp, "completed", result={"previous": previous, "current": current})
            case (
                cmds.ProcessStart()
                | cmds.ProcessInput()
                | cmds.ProcessResize()
                | cmds.ProcessSignal()
                | cmds.ProcessReplay()
            ):
                done, error = await k.processes.execute(command)
                if error is not None:
                    await fail(error.code, error.message, error.retryable)
                else:
                    await self.finish(cid, seq, fp, "completed", result=done)
            case cmds.SessionStop():
                await k.lifecycle.stop(
                    reason=command.reason or "session.stop", requested_by="control_plane", command=(cid, seq, fp)
                )
