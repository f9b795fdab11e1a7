"""Group commit for command statuses.

Every command's `accepted` and terminal status is journaled before it is announced (PROTOCOL §3).
One transaction per status means one fsync per status, serialised on the journal's lock: under a
command flood the driver then spends its time in fsync and a run's own `input.start` waits behind
thousands of them. Saves that arrive while a commit is under way are written together in the next one.
"""

from __future__ import annotations

import anyio

from driver.queue.command_index import StoredCommand
from driver.queue.journal import Journal


class _Waiter:
    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None


class CommandSaver:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._queue: list[tuple[StoredCommand, _Waiter]] = []
        self._writing = False

    async def save(
        self,
        command_id: str,
        seq: int,
        fingerprint: str,
        status: str,
        update_frame: bytes | None,
        kind: str | None = None,
    ) -> None:
        """Return once the status is durable (its batch committed); raise what the commit raised."""
        waiter = _Waiter()
        self._queue.append((StoredCommand(command_id, seq, fingerprint, status, update_frame, kind), waiter))
        if not self._writing:
            # The first caller with no commit under way writes, batch after batch, until none is left.
            # Shielded: a cancelled leader must not strand the callers whose saves it took.
            self._writing = True
            try:
                with anyio.CancelScope(shield=True):
                    while self._queue:
                        batch, self._queue = self._queue, []
                        error: BaseException | None = None
                        try:
                            await anyio.to_thread.run_sync(self._journal.save_commands, [c for c, _ in batch])
                        except Exception as exc:
                            error = exc
                        for _, w in batch:
                            w.error = error
                            w.done.set()
            finally:
                self._writing = False
        await waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error
