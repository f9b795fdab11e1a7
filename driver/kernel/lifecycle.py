"""The driver process's life around its runs: recovery after a restart, idle exit, stop and drain.

Recovery (PROTOCOL §3, §4.1) makes a restart agree with what was journaled: a run that was active
with no terminal journaled ends `run.failed{driver.restarted}`; a run whose terminal was journaled
(receipted or not) gives its `input.start` the status that mirrors that terminal, never
`driver.restarted`; every other command left open fails `driver.restarted`. Each of those statuses is
admitted as a lossless `command.finished`, so it reaches the control plane even though no link is up.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from driver import logs
from driver.kernel.runpath import STATUS_OF
from driver.ports.permissions import resolved_payload
from driver.protocol.frames import CommandError

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.kernel.lifecycle")

EXIT_DRAIN_INCOMPLETE = 70  # EX_SOFTWARE: distinct from 75 (superseded)
RESTARTED = "the driver process died while this run was active"


class Lifecycle:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel

    # -- restart recovery ----------------------------------------------------------------------------
    async def recover(self) -> None:
        """End runs a dead predecessor left active; settle the commands it left open."""
        k = self.k
        journal = k.journal
        # In a worker thread: the journal's lock may be held through a commit's fsync (§4.1's writer).
        active = await anyio.to_thread.run_sync(journal.active_runs)
        # A host tool call is an HTTP request to the MCP server that died with its process: whatever the
        # run's fate, the call is over; its one host_tool.resolved comes now, before any run's terminal.
        for call_id in await anyio.to_thread.run_sync(journal.open_host_calls):
            log.info("host_tool.died_with_driver", call_id=call_id)
            await k.emit("host_tool.resolved", {"call_id": call_id, "outcome": "cancelled"})
        from driver.kernel import keep

        resumed = await keep.prepare(k, active)
        for run_id, command_id in active:
            if (run_id, command_id) == resumed:
                k.spawn(keep.resume_run, k, run_id, command_id)  # PROTOCOL §8.2: the run continues
                continue
            # Its permission requests still open die with it: each is resolved before the terminal, so
            # the CP is never left holding a request nobody will answer (driver/queue/asked.py).
            for request in await anyio.to_thread.run_sync(journal.asked_permissions, run_id):
                if request.outcome is None:
                    cancelled = resolved_payload(request.request_id, "cancelled", None, "cancel")
                    await k.runs.emit_for_run(run_id, "permission.resolved", cancelled)
            event_id = await k.runs.emit_for_run(
                run_id,
                "run.failed",
                {
                    "error": {"code": "driver.restarted", "message": RESTARTED, "retryable": True, "details": None},
                    "dropped_best_effort": 0,
                },
            )
            k.outbox.watch(event_id)
            stored = journal.command(command_id)
            if stored is not None and stored.status not in ("completed", "failed", "cancelled"):
                restarted = CommandError("driver.restarted", RESTARTED, True)
                k.spawn(self._finish_after_receipt, event_id, stored, "failed", None, restarted)
        in_active = {c for _, c in active}
        open_commands = journal.open_commands()
        # PROTOCOL §3.1: queued runs a dead predecessor held are held again (they start after recovery).
        restored = set(
            k.runs.queue.restore(
                [
                    (c.command_id, c.kind or "")
                    for c in open_commands
                    if c.command_id not in in_active and journal.ended_run_of(c.command_id) is None
                ]
            )
        )
        for stored in open_commands:
            if stored.command_id in restored:
                continue
            if stored.kind == "input.start":
                k.runs.queue.forget_stale(stored.command_id)  # settled below or above: never queued again
            if stored.command_id in in_active:
                continue
            ended = await anyio.to_thread.run_sync(journal.ended_run_of, stored.command_id)
            if ended is not None:
                # The terminal was journaled before the predecessor died: the command mirrors it, once
                # that terminal has its receipt (it may still be in the outbox, to be resent).
                status = STATUS_OF.get(ended.terminal, "failed")
                result: dict[str, Any] | None = None
                error: CommandError | None = None
                if status == "failed":
                    e = ended.error or {}
                    error = CommandError(
                        str(e.get("code") or "provider.failed"),
                        str(e.get("message") or "the run failed"),
                        bool(e.get("retryable", False)),
                    )
                else:
                    result = {"run_id": ended.run_id, "terminal": ended.terminal, "recovered": True}
                k.spawn(self._finish_after_run_receipt, ended.run_id, stored, status, result, error)
                continue
            await k.commands.finish(
                stored.command_id,
                stored.seq,
                stored.fingerprint,
                "failed",
                error=CommandError("driver.restarted", "the driver restarted before this command completed", True),
                kind=stored.kind,
            )
        await k.processes.recover()  # §6.8: processes that died with the predecessor end once
        await k.outbox.flush()
        k.runs.queue.kick()

    async def _finish_after_receipt(
        self, event_id: str, stored: Any, status: Any, result: dict[str, Any] | None, error: CommandError | None
    ) -> None:
        await self.k.outbox.receipted(event_id)
        await self.k.commands.finish(
            stored.command_id, stored.seq, stored.fingerprint, status, result=result, error=error, kind=stored.kind
        )

    async def _finish_after_run_receipt(
        self, run_id: str, stored: Any, status: Any, result: dict[str, Any] | None, error: CommandError | None
    ) -> None:
        k = self.k
        event_id = k.outbox.pending_terminal_of(run_id)
        if event_id is not None:
            k.outbox.watch(event_id)
            await k.outbox.receipted(event_id)
        await k.commands.finish(
            stored.command_id, stored.seq, stored.fingerprint, status, result=result, error=error, kind=stored.kind
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
        k = self.k
        if k.stopping:
            if command is not None:
                await k.done.wait()
            return
        k.stopping = True
        k.fire("stop")
        log.info("driver.stopping", reason=reason, outbox=k.outbox.describe())
        # Queued runs first, so the end of the active run starts none of them (PROTOCOL §3.1).
        await k.runs.queue.cancel_all(requested_by=requested_by, reason=reason)
        run = k.run
        if run is not None:
            await k.runs.cancel_run(run, requested_by=requested_by, reason=reason)
            await run.ended.wait()
        await k.processes.stop_all()  # §6.8: TERM, then KILL after 3 s; their exits are lossless
        await k.supervisor.stop()
        if drain:
            # §8.1: the provider is stopped, its files complete; the drain below waits for the receipts.
            await k.checkpoints.at_stop()

        if k.provider.proxy is not None:
            await k.provider.proxy.close()
        await k.outbox.flush()
        drained = not drain  # nothing more can be delivered: what is journaled stays journaled
        if drain and requested_by == "signal" and not (k.link is not None and k.link.is_open):
            # A signal while the link is down (never connected, or redialing): the person or the
            # sandbox wants the process gone now, and no receipt can come without a link. What is
            # journaled stays journaled for the next driver on this state_dir (exit 70 if any).
            drain = False
        if drain:
            with anyio.move_on_after(k.options.stop_drain_timeout_s):
                await k.outbox.drained()
                drained = True
        if command is not None:
            cid, seq, fp = command
            if drained:
                # The stop's own command.finished must be stored too before the process exits.
                await k.commands.finish(cid, seq, fp, "completed", result={"reason": reason})
                with anyio.move_on_after(k.options.stop_drain_timeout_s):
                    await k.outbox.drained()
            else:
                await k.commands.finish(
                    cid,
                    seq,
                    fp,
                    "failed",
                    error=CommandError(
                        "driver.drain_timeout", f"{k.outbox.pending_count} events remain journaled", True
                    ),
                )
        if drained or k.outbox.pending_count == 0:
            k.exit_status = 0
        else:
            log.error("driver.drain_incomplete", remaining=k.outbox.pending_count)
            k.left_journaled = k.outbox.pending_count
            k.exit_status = EXIT_DRAIN_INCOMPLETE
        k.fire("stopped")
        k.done.set()

    async def idle_exit(self) -> None:
        """Cattle only (PROTOCOL §7): exit after `idle_exit_ms` with no run. A pet never idles out."""
        k = self.k
        session = k.boot.session
        if session.kind != "cattle" or session.idle_exit_ms is None:
            return
        limit = session.idle_exit_ms / 1000.0
        while not k.stopping:
            idle_for = time.monotonic() - k.last_activity
            if k.run is None and idle_for >= limit:
                log.info("driver.idle_exit", idle_ms=int(idle_for * 1000))
                await self.stop(reason="idle", requested_by="driver")
                return
            await anyio.sleep(max(0.05, limit - idle_for if k.run is None else limit))
