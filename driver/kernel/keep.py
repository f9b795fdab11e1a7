"""The kernel's side of a reattach (PROTOCOL §8.2): at recovery, claim the run a dead predecessor left
in flight under a keeper, and see it to its own terminal (driver/keeper/reattach.py has the plan and the gate).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from driver import guard, logs
from driver.adapters.common.base import ProviderError, TurnOutcome
from driver.keeper import reattach
from driver.kernel.runpath import STATUS_OF
from driver.kernel.runs import Run
from driver.protocol.frames import CommandError

if TYPE_CHECKING:
    from driver.kernel.core import Kernel

log = logs.get("driver.kernel.keep")


async def prepare(k: Kernel, active: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The (run_id, command_id) this process continues, its Run already the kernel's active run (so
    nothing else starts before the adapter re-reads the turn); None when there is nothing to reattach."""
    execution = k.boot.execution
    # Without the capability (this runtime, or this boot payload), a predecessor's keeper is ended.
    grace = execution.reattach_grace_ms if "reattach" in k.capabilities else 0
    state_dir = Path(k.boot.session.state_dir)
    plan = await anyio.to_thread.run_sync(
        reattach.prepare, state_dir, execution.runtime, grace, [run_id for run_id, _ in active]
    )
    if plan is None or plan.run_id is None:
        return None
    command_id = next(c for r, c in active if r == plan.run_id)
    run = Run(plan.run_id, command_id)
    journaled = await anyio.to_thread.run_sync(k.journal.derived_count, plan.run_id)
    run.replay = reattach.ReplayGate(journaled, plan)
    # The permission requests the CP saw and the predecessor left open keep their request_ids (§8.2).
    k.permissions.carry(await anyio.to_thread.run_sync(k.journal.asked_permissions, plan.run_id))
    k.run = run
    k.fire("run_started")
    log.info("run.reattaching", run_id=plan.run_id, journaled=journaled)
    return plan.run_id, command_id


async def resume_run(k: Kernel, run_id: str, command_id: str) -> None:
    """Like the run path's `input_start` after the adapter call: the run ends with its own terminal."""
    run = k.run
    assert run is not None and run.run_id == run_id
    outcome: TurnOutcome | None = None
    error: ProviderError | None = None
    with run.scope:
        try:
            adapter = await k.supervisor.ready()
            run.adapter = adapter
            plan = run.replay.plan if run.replay is not None else None
            if plan is None or not plan.attached:
                raise ProviderError(
                    "driver.restarted", "the driver process died and its provider was lost", retryable=True
                )
            # The silence rule (PROTOCOL §8) bounds a continued turn too: a turn the provider never
            # started or already ended unseen cannot hang the run.
            run.last_activity = time.monotonic()
            silence = anyio.CancelScope()
            k.spawn(k.telemetry.watch_silence, run, adapter, silence)
            run.turn_running.set()  # PROTOCOL §3.1: a continued turn takes steers like any other
            try:
                outcome = await adapter.resume(run_id)
            finally:
                silence.cancel()
        except ProviderError as exc:
            error = exc
        except Exception as exc:
            # The adapter's bug (or a port's): this run fails, the driver goes on (driver/guard.py).
            await guard.report(k, "run", exc, run_id=run_id)
            error = ProviderError(guard.INTERNAL_ERROR, guard.error_message("run", exc), retryable=True)
    if outcome is None and error is None and run.forced_error is not None:
        error = run.forced_error
    if error is not None and error.code == "provider.crashed" and run.adapter is not None:
        error.details.setdefault("stderr_tail", run.adapter.stderr_tail())
    if run.replay is not None:
        log.info(
            "run.reattached",
            run_id=run_id,
            suppressed=run.replay.suppressed,
            journaled=run.replay.journaled,
            dropped_best_effort=run.replay.dropped_best_effort,
        )
    with anyio.CancelScope(shield=True):
        await k.permissions.release_carried()  # before the terminal: no run event may follow it
    terminal_id = await k.runs.end_run(run, outcome, error)
    status = STATUS_OF[run.terminal or "run.failed"]
    k.outbox.watch(terminal_id)
    await k.checkpoints.after_run(run_id)  # §8.1: the native session as this run left it
    k.run = None
    k.fire("run_ended")
    run.ended.set()
    k.touch()
    if run.adapter is not None:
        if run.cancel_requested_by is not None and run.cancel_phase in ("terminate", "kill"):
            k.supervisor.lost(run.adapter, f"cancel reached {run.cancel_phase} in run {run_id}", crashed=False)
        elif error is not None and error.code in ("provider.crashed", "provider.unresponsive"):
            k.supervisor.lost(run.adapter, f"{error.code} in run {run_id}", crashed=True)
    k.runs.queue.kick()  # a run queued while this one continued starts now (§3.1)
    await k.outbox.receipted(terminal_id)
    run.receipted.set()
    stored = k.journal.command(command_id)
    if stored is None or stored.status in ("completed", "failed", "cancelled"):
        return
    if status == "failed":
        err = error or ProviderError("provider.failed", "the run failed")
        if outcome is not None and outcome.status == "failed":
            err = ProviderError(outcome.error_code or "provider.failed", outcome.error_message or "the run failed")
        await k.commands.finish(
            command_id,
            stored.seq,
            stored.fingerprint,
            "failed",
            error=CommandError(err.code, err.message, err.retryable),
            kind=stored.kind,
        )
    else:
        result = {"run_id": run_id, "terminal_event_id": terminal_id}
        await k.commands.finish(command_id, stored.seq, stored.fingerprint, status, result=result, kind=stored.kind)


async def handover(k: Kernel) -> None:
    """SIGUSR2 (sent by `agent-driver run --handover`): leave the provider, and the run in flight, to the
    successor waiting for the state_dir lock. The journal is made durable, the link closed, and the
    process exits 0 without a terminal for the run: the successor reattaches and continues it. A
    provider that is not kept cannot be handed over: then this is a stop like SIGTERM's."""
    if k.stopping:
        return
    if "reattach" not in k.capabilities or not k.supervisor.adapter.detach():
        log.info("driver.handover_stop", reason="the provider is not kept")
        await k.stop(reason="handover", requested_by="signal")
        return
    k.stopping = True
    k.handed_over = True
    log.info("driver.handover", run_id=k.run.run_id if k.run is not None else None)
    await k.outbox.flush()
    k.exit_status = 0
    k.done.set()
