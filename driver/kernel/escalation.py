"""A cancel's escalation (PROTOCOL §5): ask the adapter to interrupt, then SIGTERM the provider's
groups, then SIGKILL them, each step only while the run has not ended; a run whose adapter does not
return even with its provider dead is ended without it.

Free of the kernel: the run, the bounds and the one way to signal the provider are given.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import anyio

from driver import logs
from driver.kernel.options import KernelOptions
from driver.kernel.runs import Run

log = logs.get("driver.kernel.runs")

KILL_WAIT_S = 1.0  # after SIGKILL, how long the adapter has to return before the run ends without it


async def escalate(run: Run, opts: KernelOptions, signal_provider: Callable[[Run, int], None]) -> None:
    adapter = run.adapter
    if adapter is None:
        # The run is still waiting for its provider to (re)start: nothing to interrupt or signal
        # (the provider being started belongs to the next run), so end it now.
        run.scope.cancel()
        return
    # One deadline for asking and for waiting: a cancel() that hangs does not buy more time.
    deadline = anyio.current_time() + opts.cancel_interrupt_grace_s
    try:
        with anyio.move_on_after(opts.cancel_interrupt_grace_s):
            await adapter.cancel()
    except Exception as exc:
        log.warning("cancel.interrupt_failed", error=str(exc))
    with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
        await run.ended.wait()
        return
    run.cancel_phase = "terminate"
    signal_provider(run, signal.SIGTERM)
    with anyio.move_on_after(opts.cancel_term_grace_s):
        await run.ended.wait()
        return
    run.cancel_phase = "kill"
    signal_provider(run, signal.SIGKILL)
    with anyio.move_on_after(KILL_WAIT_S):
        await run.ended.wait()
        return
    # The adapter did not return even with its provider dead: end the run without it.
    run.scope.cancel()
