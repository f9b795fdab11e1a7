"""Queued runs (PROTOCOL §3.1): `input.start{"queue": true}` while a run is active is held, journaled,
and started in `seq` order, each as soon as the run before it is terminal.

A held command's body is journaled (a `texts` row per command, through the journal's public
`set_text`) once it is queued, so a driver restart keeps it: recovery puts the commands still
`accepted` with a body back in the queue (`restore`). The row goes when the run leaves the queue (it
starts, or is cancelled); in both cases the run is first recorded as started in the journal's `runs`
table, so a crash in between ends it like any active run (`driver.restarted`), never twice.

A cancelled queued run ends `run.cancelled{details.phase: "queued"}` with no `run.started`, and its
`input.start` ends `cancelled` once that terminal has its receipt (the status mirrors the terminal).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import msgspec

from driver import logs
from driver.protocol import commands as cmds
from driver.queue.outbox import utc_now

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.kernel.queued")

MAX_QUEUED = 16
KEY_PREFIX = "queued_run:"  # + command_id: the journaled body of a held input.start


class _Held(msgspec.Struct, frozen=True):
    """What a journaled queue row holds: the command (re-encoded from its struct) and its fingerprint."""

    command: cmds.InputStart
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Queued:
    command: cmds.InputStart
    fingerprint: str

    @property
    def run_id(self) -> str:
        return self.command.run_id


def key_of(command_id: str) -> str:
    return KEY_PREFIX + command_id


def cancelled_payload(reason: str, requested_by: str) -> dict[str, object]:
    """`run.cancelled` of a run that never started: nothing ran, so no tool calls, no side effects."""
    return {
        "reason": reason,
        "requested_by": requested_by,
        "dropped_best_effort": 0,
        "tool_calls": [],
        "side_effects": {"files_changed": [], "processes_left": []},
        "details": {"phase": "queued"},
    }


class RunQueue:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.items: list[Queued] = []
        self._starting = False  # a queued run is being started (between the pop and `k.run` being set)
        # Slots taken by `reserve` whose `hold` has not appended yet (PROTOCOL §9 "Check and act are one
        # step"): the cap counts them, so a burst cannot pass the check while the first journal write waits.
        self._reserved = 0

    def run_ids(self) -> list[str]:
        return [q.run_id for q in self.items]

    def find(self, run_id: str) -> Queued | None:
        return next((q for q in self.items if q.run_id == run_id), None)

    @property
    def busy(self) -> bool:
        """Queued runs come first: a new input.start must not overtake them between two runs."""
        return bool(self.items) or self._starting or self._reserved > 0

    @property
    def full(self) -> bool:
        return len(self.items) + self._reserved >= MAX_QUEUED

    def reserve(self) -> bool:
        """Take one of the 16 slots now, before any await (False: the queue is full). The caller then
        calls `hold`, which gives the slot back whether it holds the command or fails."""
        if self.full:
            return False
        self._reserved += 1
        return True

    async def hold(self, command: cmds.InputStart, fingerprint: str) -> None:
        """Journal the command's body, then hold it in the slot the caller reserved (`reserve`)."""
        try:
            body = msgspec.json.encode(_Held(command, fingerprint)).decode()
            await anyio.to_thread.run_sync(self.k.journal.set_text, key_of(command.command_id), body)
            self.items.append(Queued(command, fingerprint))
        finally:
            self._reserved -= 1
        self.items.sort(key=lambda q: q.command.seq)
        log.info("run.queued", run_id=command.run_id, command_id=command.command_id, queued=len(self.items))
        self.kick()

    def restore(self, open_commands: list[tuple[str, str]]) -> list[str]:
        """After a restart: hold again the queued commands an earlier process journaled and never
        started. `open_commands` are (command_id, kind) of commands still open that did not start a
        run. Returns the command ids restored."""
        journal = self.k.journal
        restored: list[str] = []
        for command_id, kind in open_commands:
            if kind != "input.start":
                continue
            raw = journal.text(key_of(command_id))
            if raw is None:
                continue
            try:
                held = msgspec.json.decode(raw, type=_Held)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.error("run.queue_row_invalid", command_id=command_id, error=str(exc))
                continue
            self.items.append(Queued(held.command, held.fingerprint))
            restored.append(command_id)
        self.items.sort(key=lambda q: q.command.seq)
        return restored

    def forget_stale(self, command_id: str) -> None:
        """Drop a journaled queue row whose command is settled some other way (restart recovery)."""
        self.k.journal.set_text(key_of(command_id), None)

    def kick(self) -> None:
        """Start the next queued run if nothing runs (called when a run ends and when one is queued)."""
        k = self.k
        if not self.items or self._starting or k.run is not None or k.stopping:
            return
        nxt = self.items.pop(0)
        self._starting = True
        k.spawn(self._start, nxt)

    async def _start(self, q: Queued) -> None:
        k = self.k
        if k.stopping or k.provider.resetting:
            # A stop or a reset came between the pop and this task: it cancels the queue, this too.
            self.items.insert(0, q)
            self._starting = False
            why = "the driver is stopping" if k.stopping else "a session.reset came first"
            await self.cancel(q.run_id, requested_by="driver", reason=why)
            return
        try:
            # The run is journaled as started (inside input_start) before its queue row goes.
            await k.runs.input_start(q.command, q.fingerprint, from_queue=True, on_registered=self._registered(q))
        finally:
            self._starting = False
            self.kick()

    def _registered(self, q: Queued) -> Callable[[], Awaitable[None]]:
        async def done() -> None:
            self._starting = False
            await anyio.to_thread.run_sync(self.k.journal.set_text, key_of(q.command.command_id), None)

        return done

    async def cancel(self, run_id: str, *, requested_by: str, reason: str) -> str | None:
        """End a queued run `run.cancelled{phase: queued}`; its input.start ends `cancelled` once the
        terminal has its receipt. Returns the terminal's event id (None when `run_id` is not queued)."""
        q = self.find(run_id)
        if q is None:
            return None
        self.items.remove(q)
        k = self.k
        cid = q.command.command_id
        await anyio.to_thread.run_sync(k.journal.run_started, run_id, cid, utc_now())
        await anyio.to_thread.run_sync(k.journal.set_text, key_of(cid), None)
        event_id = await k.runs.emit_for_run(run_id, "run.cancelled", cancelled_payload(reason, requested_by))
        k.outbox.watch(event_id)
        log.info("run.queued_cancelled", run_id=run_id, command_id=cid, requested_by=requested_by)
        k.spawn(self._finish_after_receipt, q, event_id)
        return event_id

    async def _finish_after_receipt(self, q: Queued, event_id: str) -> None:
        k = self.k
        await k.outbox.receipted(event_id)
        cmd = q.command
        result = {"run_id": cmd.run_id, "terminal_event_id": event_id}
        await k.commands.finish(cmd.command_id, cmd.seq, q.fingerprint, "cancelled", result=result, kind="input.start")

    async def cancel_all(self, *, requested_by: str, reason: str) -> list[str]:
        """`session.reset` / `session.stop`: cancel every queued run, in queue order."""
        ids = self.run_ids()
        for run_id in ids:
            await self.cancel(run_id, requested_by=requested_by, reason=reason)
        return ids
