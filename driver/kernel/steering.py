"""`input.steer` (PROTOCOL §3.1): more user input for the active run.

The adapter delivers it the way its runtime can (`Adapter.steer`: into the running turn, or as one
more turn of the same run once the current one ends) and returns once the provider has it. Then, and
only then, `input.steered` is admitted, the text joins the transcript, and the command completes
with `result{mode}`. While a steer is on its way the run's terminal waits for it (`settle`, bounded),
so an `input.steered` is never after its run's terminal. A cancel wins over a steer not yet delivered:
that steer ends `cancelled`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import anyio

from driver import logs, tasks
from driver.adapters.common.base import ProviderError, SteerRefused
from driver.protocol import commands as cmds
from driver.protocol.frames import CommandError

if TYPE_CHECKING:
    from driver.kernel.core import Kernel
    from driver.kernel.runs import Run

log = logs.get("driver.kernel.steering")

SETTLE_S = 5.0  # how long a terminal waits for steers on their way (a provider that never answers)
NOT_ACTIVE = "run.not_active"
# Bounds of what the CP can pile onto one run (PROTOCOL §3.1, docs/protocol.md): a steer's text in UTF-8
# bytes, and the steers of a run not yet delivered to its provider (a follow-up waits for its turn).
MAX_STEER_TEXT_BYTES = 256 * 1024
MAX_PENDING_STEERS = 8
TOO_LARGE = "steer.too_large"
TOO_MANY = "steer.too_many"

Answer = tuple[Literal["completed", "failed", "cancelled"], dict[str, object] | None, CommandError | None]


async def first_of(*events: anyio.Event) -> None:
    """Return as soon as any of `events` is set."""
    if any(e.is_set() for e in events):
        return
    async with tasks.within("first_of") as tg:

        async def wait(event: anyio.Event) -> None:
            await event.wait()
            tg.cancel_scope.cancel()

        for event in events:
            tg.spawn(wait, event)


def _not_active(run_id: str, why: str) -> Answer:
    return "failed", None, CommandError(NOT_ACTIVE, f"run {run_id} is not active: {why}")


class Steering:
    def __init__(self, kernel: Kernel) -> None:
        self.k = kernel

    async def steer(self, command: cmds.InputSteer, fp: str) -> None:
        k = self.k
        status, result, error = await self._steer(command)
        await k.commands.finish(command.command_id, command.seq, fp, status, result=result, error=error)

    async def _steer(self, command: cmds.InputSteer) -> Answer:
        k = self.k
        run = k.run
        if run is None or run.run_id != command.run_id:
            queued = k.runs.queue.find(command.run_id) is not None
            return _not_active(command.run_id, "it is queued" if queued else "no such run is running")
        if run.terminal is not None:
            return _not_active(command.run_id, "it is ending")
        if run.cancel_requested_by is not None:
            # Still active, but a cancel was asked first: it wins over a steer not yet delivered.
            return "cancelled", {"run_id": run.run_id, "reason": "the run was cancelled first"}, None
        mode = k.capability_mode("steer")
        if mode is None:
            return "failed", None, CommandError("steer.unsupported", f"{k.boot.execution.runtime} cannot be steered")
        size = len(command.input.text.encode("utf-8", "surrogatepass"))
        if size > MAX_STEER_TEXT_BYTES:
            message = f"input.text is {size} bytes; a steer carries at most {MAX_STEER_TEXT_BYTES}"
            return "failed", None, CommandError(TOO_LARGE, message)
        if run.steers_in_flight >= MAX_PENDING_STEERS:
            message = f"{MAX_PENDING_STEERS} steers of this run are still on their way; retry once one is delivered"
            return "failed", None, CommandError(TOO_MANY, message, retryable=True)
        # Counted before the first await: the bound and the count are one step (PROTOCOL §9).
        run.steers_in_flight += 1
        try:
            return await self._deliver(run, command, mode)
        finally:
            run.steers_in_flight -= 1
            if run.steers_in_flight == 0:
                run.steers_settled.set()
                run.steers_settled = anyio.Event()

    async def _deliver(self, run: Run, command: cmds.InputSteer, mode: str) -> Answer:
        k = self.k
        # The run may still be waiting for its provider: the steer waits for the turn (or its end).
        await first_of(run.turn_running, run.cancel_asked, run.ended)
        if run.cancel_asked.is_set():
            return "cancelled", {"run_id": run.run_id, "reason": "the run was cancelled first"}, None
        if run.terminal is not None or run.ended.is_set() or run.adapter is None:
            return _not_active(run.run_id, "it ended")
        try:
            prepared = await k.runs.prepare_input(command.input)
        except ProviderError as exc:
            return "failed", None, CommandError(exc.code, exc.message, exc.retryable)
        if run.cancel_asked.is_set():
            return "cancelled", {"run_id": run.run_id, "reason": "the run was cancelled first"}, None
        try:
            await run.adapter.steer(run.run_id, prepared)
        except SteerRefused as exc:
            if exc.code == "cancelled":
                return "cancelled", {"run_id": run.run_id, "reason": exc.message}, None
            return "failed", None, CommandError(exc.code, exc.message, exc.retryable)
        except ProviderError as exc:
            return "failed", None, CommandError(exc.code, exc.message, exc.retryable)
        except Exception as exc:  # an adapter bug must not escape: the run goes on
            log.exception("steer.adapter_error", run_id=run.run_id)
            return "failed", None, CommandError("driver.internal", f"{type(exc).__name__}: {exc}")
        text = command.input.text
        payload = {"run_id": run.run_id, "command_id": command.command_id, "text": text, "mode": mode}
        event_id = await k.emit("input.steered", payload)
        if event_id is None:
            # Delivered after the terminal was chosen (settle gave up on it): no event may follow it.
            return _not_active(run.run_id, "it ended while the input was on its way")
        await k.provider.note_user_message(text)
        log.info("run.steered", run_id=run.run_id, command_id=command.command_id, mode=mode)
        return "completed", {"run_id": run.run_id, "mode": mode, "event_id": event_id}, None

    async def settle(self, run: Run) -> None:
        """Wait (bounded) until no steer of `run` is on its way."""
        with anyio.move_on_after(SETTLE_S):
            while run.steers_in_flight:
                await run.steers_settled.wait()
