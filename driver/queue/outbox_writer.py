"""The outbox's writer: seq stamping with its durable reservation, and the group commit.

Everything admitted meanwhile is written in one SQLite transaction with one fsync, together with the
deletions of receipted events and, when due, the next seq reservation (`Journal.commit`). The outbox
(`outbox.Outbox`) owns the events' lifecycle; this owns only the order and durability of its writes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio
import anyio.to_thread

from driver.queue.journal import Journal
from driver.queue.schema import SEQ_BLOCK

# Deletions of receipted events ride on the next group commit of admitted events; only when none comes
# within this delay are they committed alone. A deletion needs no fsync of its own (a crash that undoes
# one only makes the next process resend an event the CP accepts again by its event_id), and a separate
# transaction per receipt added up to one fsync per event at a steady rate: it held the writer when the
# next event arrived and competed for the disk with the CP's own commit (measured in bench/event_path.py
# latency runs: the driver's p99 was ~2x the durable floor's, whose client also defers its deletions).
DELETE_FLUSH_S = 0.1
# ...unless this many are waiting: then they are committed at once. A flood's receipts come 256 events
# at a time, and deferring all of them to the end put one transaction of ~30,000 deletions on the
# critical path of `drained()` (throughput ~10% lower in bench/event_path.py); in chunks they are
# written while later batches are on the wire.
DELETE_BATCH_MAX = 512
# Events per group commit at most. Under a flood, one huge transaction would make every event wait
# for the last one before the first is sent; chunks let sending overlap journaling.
COMMIT_MAX_EVENTS = 1024

# One journal row in JournaledEvent's column order (seq, event_id, run_id, kind, body): plain tuples,
# because a NamedTuple's __new__ costs µs per event.
Row = tuple[int, str, str | None, str, bytes]


class Writer:
    def __init__(self, journal: Journal, on_journaled: Callable[[list[Row]], None], after: Callable[[], None]) -> None:
        """`on_journaled(rows)` runs once rows are durable; `after()` at the end of every commit."""
        self.journal = journal
        self._on_journaled = on_journaled
        self._after = after
        # Admitted, not yet journaled, oldest first. Their bodies cannot be evicted until written.
        self.unsynced: deque[Row] = deque()
        self.unsynced_bytes = 0
        self._to_delete: list[int] = []
        self._deleting = 0  # transactions in progress (`drained` means gone from disk)
        self._seq_next, self._seq_end = journal.reserve_seqs()
        self._reserve_target = 0  # a reservation riding on the next group commit (0: none)
        self._work = anyio.Event()
        self._work_due = False
        self.committed = anyio.Event()  # set (and replaced) after each group commit that wrote events
        self._deletions = anyio.Event()  # set when a deletion waits for a commit (see DELETE_FLUSH_S)

    @property
    def first_seq(self) -> int:
        """The first seq this process may stamp: above every seq an earlier process reserved."""
        return self._seq_next

    @property
    def busy(self) -> bool:
        """Anything admitted or deleted that is not yet written, or a write in progress."""
        return bool(self.unsynced or self._to_delete or self._deleting)

    # -- seqs -----------------------------------------------------------------------------------------
    async def next_seq(self) -> int:
        """The next seq. Seqs are used only once durably reserved (best-effort events are never
        journaled, so the reservation is what stops a later process from reusing theirs). The next
        block is reserved ahead, inside a group commit; only a producer that outruns the writer waits."""
        while self._seq_next >= self._seq_end:
            self._reserve_ahead()
            await self.flush()
        if self._reserve_target == 0 and self._seq_end - self._seq_next < SEQ_BLOCK // 2:
            self._reserve_ahead()
        seq = self._seq_next
        self._seq_next += 1
        return seq

    def _reserve_ahead(self) -> None:
        if self._reserve_target == 0:
            self._reserve_target = self._seq_end - 1 + SEQ_BLOCK
            self.kick()

    # -- writes ---------------------------------------------------------------------------------------
    def append(self, row: Row) -> None:
        self.unsynced.append(row)
        self.unsynced_bytes += len(row[4])
        self.kick()

    def delete(self, seq: int, *, now: bool = False) -> None:
        """Delete `seq`'s row with the next group commit, or in a commit of its own when `now` (or
        after DELETE_FLUSH_S without one)."""
        self._to_delete.append(seq)
        if now or len(self._to_delete) >= DELETE_BATCH_MAX:
            self.kick()
        else:
            self._deletions.set()

    def flush_deletions(self) -> None:
        """Commit the waiting deletions now, not after DELETE_FLUSH_S."""
        if self._to_delete:
            self.kick()

    def kick(self) -> None:
        """Wake the writer (once per group commit, not once per event: this is on the hot path)."""
        if not self._work_due:
            self._work_due = True
            self._work.set()

    async def run(self) -> None:
        """Group commits and deletions, for the process's life."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._flush_deletions_when_idle)
            while True:
                await self._work.wait()
                self._work = anyio.Event()
                self._work_due = False
                await self.commit(COMMIT_MAX_EVENTS)
                if self.unsynced:
                    self.kick()  # a flood: commit the rest next, so sending starts with the first chunk

    async def _flush_deletions_when_idle(self) -> None:
        """Commit waiting deletions alone when no admitted event carried them within DELETE_FLUSH_S."""
        while True:
            await self._deletions.wait()
            self._deletions = anyio.Event()
            await anyio.sleep(DELETE_FLUSH_S)
            self.flush_deletions()

    async def flush(self) -> None:
        """Make everything admitted so far durable, apply pending deletions and extend the seq
        reservation when one is due."""
        remaining = len(self.unsynced)
        while True:
            await self.commit(COMMIT_MAX_EVENTS)
            remaining -= COMMIT_MAX_EVENTS
            if remaining <= 0:
                return

    async def commit(self, limit: int) -> None:
        """One transaction: up to `limit` admitted events, every pending deletion, a due reservation."""
        take = min(limit, len(self.unsynced))
        rows = [self.unsynced.popleft() for _ in range(take)]
        self.unsynced_bytes -= sum(len(r[4]) for r in rows)
        deletes, self._to_delete = self._to_delete, []
        reserve = self._reserve_target
        if rows or deletes or reserve:
            self._deleting += 1
            try:
                await anyio.to_thread.run_sync(self.journal.commit, rows, deletes, reserve)
            finally:
                self._deleting -= 1
            if reserve and reserve >= self._seq_end:
                self._seq_end = reserve + 1
                if self._reserve_target == reserve:
                    self._reserve_target = 0
            if rows:
                self._on_journaled(rows)
                self.committed.set()
                self.committed = anyio.Event()
        self._after()
