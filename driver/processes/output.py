"""The output path of the process room (PROTOCOL §6.8): a process's bytes into its ring first, then
out as best-effort `process.output` events with the offset of their first byte, paced.

Flow control: the reader pauses while best-effort events wait for the link, so a flood slows the
process (as a terminal over ssh would) instead of filling the buffer and dropping; and the lossless
path goes first: output waits while lossless events wait for their receipts, or while a command under
way is about to admit its `command.finished`. Bounded: a stalled link or a steady stream of lossless
events slows a process, never stops it. The decision is `must_wait`; the waiting is `Output.pace`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import anyio

from driver.processes import handle
from driver.processes.proc import Proc
from driver.processes.text import chunk_limit, decode, live_split, output_chunks

PACE_EVENTS = 2
PACE_STEP_S = 0.002
PACE_MAX_STEPS = 500

Emit = Callable[[str, dict[str, Any]], Awaitable[object]]


def must_wait(*, link_up: bool, best_effort_waiting: int, lossless_pending: int, commands: Iterable[str]) -> bool:
    """Whether the next chunk waits. Not while the link is down: nothing is sent then, and the ring
    keeps the output for a replay. `commands`: the kinds of the commands under way (process.*
    excepted: a keystroke's echo must not wait for its own command)."""
    if not link_up:
        return False
    busy = best_effort_waiting >= PACE_EVENTS or lossless_pending > 0
    return busy or any(not kind.startswith("process.") for kind in commands)


class Output:
    """`emit` admits an event; `max_event_bytes` is the link's current bound (§4.3); `waits` is
    `must_wait` applied to the outbox and the command desk as they are now."""

    def __init__(self, emit: Emit, max_event_bytes: Callable[[], int], waits: Callable[[], bool]) -> None:
        self._emit = emit
        self._max_event_bytes = max_event_bytes
        self._waits = waits

    async def send(self, p: Proc, offset: int, data: bytes, *, truncated_before: bool = False) -> None:
        """Send `data` (output from `offset`) as process.output events of at most the chunk limit,
        cut between characters."""
        for at, piece in output_chunks(data, chunk_limit(self._max_event_bytes()), truncated_before=truncated_before):
            body: dict[str, Any] = {"process_id": p.process_id, "offset": offset + at, "data": decode(piece)}
            if at == 0 and truncated_before:
                body["truncated_before"] = True  # an empty event says it when nothing is left to resend
            await self._emit("process.output", body)
            await self.pace()  # a replay of 1 MiB must not overflow the best-effort buffer either

    async def live(self, p: Proc, data: bytes, *, final: bool) -> None:
        ready, rest = live_split(p.pending, data, final=final)
        if ready:
            await self.send(p, p.next_live, ready)
        p.next_live += len(ready)
        p.pending = rest

    async def pump(self, p: Proc) -> None:
        """Read the process's output until its end: into the ring, then live."""
        fd = p.spawned.read_fd
        try:
            while True:
                await anyio.wait_readable(fd)
                data, eof = handle.read_available(fd, chunk_limit(self._max_event_bytes()))
                if data:
                    p.ring.append(data)
                    await self.live(p, data, final=False)
                if eof:
                    return
        finally:
            p.output_done.set()

    async def pace(self) -> None:
        for _ in range(PACE_MAX_STEPS):
            if not self._waits():
                return
            await anyio.sleep(PACE_STEP_S)
