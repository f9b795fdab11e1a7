"""The run path: `input.start` to the run's one terminal event, and cancellation (PROTOCOL §3, §5).

A run is a task in its own cancel scope. Its terminal is chosen once (`driver.kernel.runs.choose_terminal`:
a cancel requested before the choice wins), admitted as a lossless event, and the run's `input.start`
completes only when that terminal has a receipt, with a status that mirrors it. What the run leaves
behind (side effects, artifacts) is `driver.kernel.reports`; a cancel's interrupt-TERM-KILL ladder is
`driver.kernel.escalation`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import anyio

from driver import guard, logs
from driver.adapters.common.base import PathNotAllowed, ProviderError, TurnOutcome
from driver.kernel import escalation, side_effects
from driver.kernel.queued import RunQueue
from driver.kernel.reports import RunReports
from driver.kernel.runs import Run, choose_terminal, declined_tool_events
from driver.kernel.steering import Steering
from driver.ports import artifacts
from driver.protocol import commands as cmds
from driver.protocol import paths
from driver.protocol.events import EVENT_KINDS, fit_payload
from driver.protocol.frames import CommandError
from driver.queue.outbox import utc_now

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.kernel.runs")

STATUS_OF: dict[str, Literal["completed", "failed", "cancelled"]] = {
    "run.completed": "completed",
    "run.failed": "failed",
    "run.cancelled": "cancelled",
}


def summary(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class RunPath:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel
        self.queue = RunQueue(kernel)  # PROTOCOL §3.1: input.start{"queue": true}
        self.steering = Steering(kernel)  # PROTOCOL §3.1: input.steer
        self.reports = RunReports(kernel)  # PROTOCOL §5, §6.5: side effects and artifacts

    async def emit_for_run(self, run_id: str, kind: str, payload: dict[str, object]) -> str:
        """Admit a run terminal (or another run-scoped event) for `run_id`, whatever run is active."""
        spec = EVENT_KINDS[kind]
        self.k.telemetry.observe(kind, payload)
        body = fit_payload(kind, paths.validated(kind, payload), self.k.max_event_bytes)  # §4.3
        return await self.k.outbox.admit(kind, body, spec.delivery, run_id)

    async def input_start(
        self,
        command: cmds.InputStart,
        fp: str,
        *,
        from_queue: bool = False,
        on_registered: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """Run `command` to its terminal. `from_queue`: a held run the queue starts now (it was
        checked when it arrived); `on_registered` is called once the run is journaled as started.
        False when the command was refused without running or holding its run (its run_id is free)."""
        k = self.k
        cid, seq = command.command_id, command.seq
        # Queued runs come first: a new input.start arriving between two runs must not overtake them.
        if not from_queue and (k.run is not None or self.queue.busy):
            # A run whose terminal is chosen is no longer active (PROTOCOL §3): what is left of it (the
            # terminal's receipt, the checkpoint of §8.1) must not refuse the next input, which a control
            # plane sends as soon as it sees the terminal. It waits its turn like a queued one.
            ending = k.run is not None and k.run.terminal is not None and not self.queue.busy
            if not command.queue and not ending:
                await k.commands.finish(
                    cid, seq, fp, "failed", error=CommandError("driver.run_active", "a run is already active", True)
                )
                return False
            if not self.queue.reserve():  # the slot is taken here, before any await (PROTOCOL §9)
                message = "16 inputs are already queued; retry once one has started"
                await k.commands.finish(cid, seq, fp, "failed", error=CommandError("driver.queue_full", message, True))
                return False
            await self.queue.hold(command, fp)
            return True
        if k.provider.resetting:
            await k.commands.finish(
                cid, seq, fp, "failed", error=CommandError("driver.busy", "a session.reset is in progress", True)
            )
            return False
        run = Run(command.run_id, cid)
        k.run = run
        try:
            await self._run(run, command, fp, on_registered)
        except Exception as exc:
            await self._internal_error(run, command, fp, exc)
        return True

    async def _internal_error(self, run: Run, command: cmds.InputStart, fp: str, exc: Exception) -> None:
        """The supervision boundary of a run: an unexpected error ends it `run.failed{driver.internal_error}`
        (unless its terminal was already chosen), its input.start mirrors the terminal, the driver goes on."""
        k = self.k
        cid, seq = command.command_id, command.seq
        await guard.report(k, "run", exc, run_id=run.run_id)
        message = guard.error_message("run", exc)
        terminal_id: str | None = None
        try:
            if run.terminal is None:
                run.terminal = "run.failed"
                error = {"code": guard.INTERNAL_ERROR, "message": message, "retryable": True, "details": None}
                dropped = k.outbox.dropped_for_run(run.run_id)
                terminal_id = await self.emit_for_run(
                    run.run_id, "run.failed", {"error": error, "dropped_best_effort": dropped}
                )
                k.outbox.watch(terminal_id)
        finally:
            if k.run is run:
                k.run = None
                k.fire("run_ended")
            run.ended.set()
            k.touch()
            self.queue.kick()  # a held run must not wait behind one that failed this way (§3.1)
        if terminal_id is not None:
            await k.outbox.receipted(terminal_id)
        run.receipted.set()
        stored = k.journal.command(cid)
        if stored is not None and stored.status in ("completed", "failed", "cancelled"):
            return
        status = STATUS_OF[run.terminal]
        if status == "failed":
            await k.commands.finish(cid, seq, fp, "failed", error=CommandError(guard.INTERNAL_ERROR, message, True))
        else:
            result = {"run_id": run.run_id, "terminal_event_id": terminal_id}
            await k.commands.finish(cid, seq, fp, status, result=result)

    async def _run(
        self,
        run: Run,
        command: cmds.InputStart,
        fp: str,
        on_registered: Callable[[], Awaitable[None]] | None,
    ) -> None:
        k = self.k
        cid, seq = command.command_id, command.seq
        k.telemetry.run_starting(command)
        k.fire("run_started")
        await anyio.to_thread.run_sync(k.journal.run_started, run.run_id, cid, utc_now())
        if on_registered is not None:
            await on_registered()
        await k.emit(
            "run.started",
            {"run_id": run.run_id, "revision": k.boot.execution.revision, "input_summary": summary(command.input.text)},
        )
        await k.provider.note_user_message(command.input.text)
        outcome: TurnOutcome | None = None
        error: ProviderError | None = None
        cwd = Path(k.boot.session.cwd)
        outputs_before = await self.reports.outputs_before(cwd)
        run.files_before = await self.reports.files_snapshot(cwd)
        with run.scope:
            try:
                run_input = await self.prepare_input(command.input)
                adapter = await k.supervisor.ready()
                run.adapter = adapter
                run.processes_before = {p["pid"] for p in side_effects.tree_processes([os.getpid()])}
                run.last_activity = time.monotonic()
                silence = anyio.CancelScope()
                k.spawn(k.telemetry.watch_silence, run, adapter, silence)
                run.turn_running.set()  # steers may go to the adapter now
                try:
                    outcome = await adapter.run(run.run_id, run_input)
                finally:
                    silence.cancel()
            except ProviderError as exc:
                error = exc
            except Exception as exc:
                # The adapter's bug (or a port's): this run fails, the driver goes on (guard).
                await guard.report(k, "run", exc, run_id=run.run_id)
                error = ProviderError(guard.INTERNAL_ERROR, guard.error_message("run", exc), retryable=True)
        await self.reports.artifacts(cwd, outputs_before)
        if outcome is None and error is None and run.forced_error is not None:
            error = run.forced_error
        if k.provider.proxy is not None:
            outcome, error = await k.provider.proxy.settle(run, outcome, error)
        if error is not None and error.code == "provider.crashed" and run.adapter is not None:
            error.details.setdefault("stderr_tail", run.adapter.stderr_tail())
        terminal_id = await self.end_run(run, outcome, error)
        status = STATUS_OF[run.terminal or "run.failed"]
        k.outbox.watch(terminal_id)
        # §8.1: the native session as this run left it, before the next run can start.
        await k.checkpoints.after_run(run.run_id)
        k.run = None
        k.fire("run_ended")
        attempt = k.supervisor.attempt
        if not attempt.done.is_set() or attempt.error is not None:
            # The provider is being replaced (or failed to start): say "starting", not "ready".
            k.fire("provider_lost")
        run.ended.set()
        k.touch()
        if run.adapter is not None:
            if run.cancel_requested_by is not None and run.cancel_phase in ("terminate", "kill"):
                # We killed it (its adapter may call that a crash): restart for the next run, not a crash.
                reason = f"cancel reached {run.cancel_phase} in run {run.run_id}"
                k.supervisor.lost(run.adapter, reason, crashed=False)
            elif error is not None and error.code in ("provider.crashed", "provider.unresponsive"):
                k.supervisor.lost(run.adapter, f"{error.code} in run {run.run_id}", crashed=True)
            elif attempt.adapter is run.adapter and attempt.error is None:
                await k.telemetry.after_run(run)  # the resource guard: between runs, never during one
        self.queue.kick()  # the next queued run starts as soon as this one is terminal (§3.1)
        await k.outbox.receipted(terminal_id)
        run.receipted.set()
        result = {"run_id": run.run_id, "terminal_event_id": terminal_id}
        if status == "failed":
            err = error or ProviderError("provider.failed", "the run failed")
            if outcome is not None and outcome.status == "failed":
                err = ProviderError(outcome.error_code or "provider.failed", outcome.error_message or "the run failed")
            await k.commands.finish(cid, seq, fp, "failed", error=CommandError(err.code, err.message, err.retryable))
        else:
            await k.commands.finish(cid, seq, fp, status, result=result)

    async def end_run(self, run: Run, outcome: TurnOutcome | None, error: ProviderError | None) -> str:
        """Choose the run's one terminal (driver.kernel.runs) and admit it. A cancel requested before this
        point wins."""
        k = self.k
        for kind, payload in declined_tool_events(run, k.permissions.rejected_tool_calls):
            await k.emit(kind, payload)
        k.permissions.rejected_tool_calls.clear()
        await k.host_tools.cancel_run(run.run_id)
        # A steer on its way to the provider is either delivered (its input.steered comes before the
        # terminal) or refused first; bounded, so a provider that never answers cannot hold the run.
        await self.steering.settle(run)
        effects = await self.reports.side_effects(run) if run.cancel_requested_by is not None else None
        if effects is not None:
            effects["files_changed"] = [paths.carry(c) for c in effects["files_changed"]]
        kind, payload = choose_terminal(run, outcome, error, k.outbox.dropped_for_run(run.run_id), effects)
        run.terminal = kind
        event_id = await self.emit_for_run(run.run_id, kind, payload)
        k.outbox.best_effort.forget_run(run.run_id)
        return event_id

    async def cancel_run(self, run: Run, *, requested_by: str, reason: str) -> None:
        """PROTOCOL §5: cancel permissions, interrupt, then SIGTERM and SIGKILL the provider if needed."""
        if run.terminal is not None or run.cancel_requested_by is not None:
            return
        run.cancel_requested_by = requested_by
        run.cancel_reason = reason
        run.cancel_asked.set()  # a cancel wins over steers not yet delivered (§3.1)
        self.k.permissions.cancel_all()
        self.k.spawn(escalation.escalate, run, self.k.options, self.signal_provider)

    def signal_provider(self, run: Run, sig: int) -> None:
        k = self.k
        adapter = run.adapter or k.adapter
        for pgid in k.supervisor.signal(adapter, sig):
            if pgid not in run.signalled_groups:
                run.signalled_groups.append(pgid)
        log.warning("cancel.signalled", run_id=run.run_id, signal=sig, groups=run.signalled_groups)

    async def prepare_input(self, run_input: cmds.RunInput) -> cmds.RunInput:
        """Download attachments into cwd/inputs/ and tell the provider where they are (in the prompt,
        the one channel every runtime reads); the attachments stay on the input, so an adapter can
        also hand images (and texts) to its runtime natively (driver/adapters/common/attachments.py)."""
        if not run_input.attachments:
            return run_input
        k = self.k
        cwd = Path(k.boot.session.cwd)
        try:
            for att in run_input.attachments:
                k.files.admit(artifacts.attachment_path(cwd, att.name))
            saved = await artifacts.download_attachments(
                cwd, run_input.attachments, deadline_s=k.options.attachment_timeout_s
            )
        except (artifacts.AttachmentError, PathNotAllowed) as exc:
            raise ProviderError("input.attachment_invalid", str(exc)) from None
        listing = ", ".join(f"{p.relative_to(cwd)} ({a.size} bytes)" for a, p in saved)
        text = f"{run_input.text}\n\n[Attached files, in the working directory: {listing}]"
        return cmds.RunInput(text=text, attachments=run_input.attachments)
