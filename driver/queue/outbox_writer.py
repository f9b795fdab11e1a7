"""The journal's one writer: seq stamping with its durable reservation, and the group commit.

Every journal write of the hot path goes through here, in order (issue 19): admitted events, command
statuses (a terminal one together with its `command.finished` event), deletions of receipted events,
rows set aside, cut bodies and the seq reservation. One transaction with one fsync takes everything
queued meanwhile (`Journal.commit`). Commits never run concurrently and each takes the OLDEST queued
events first, so within an epoch the durable events are always a prefix of the admitted ones.

While `run()` is running it is the only committer and `flush()` waits on it; without it (tests and
benches that never start the writer task) `flush()` commits itself, under the same lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio
import anyio.to_thread

from driver import logs, tasks
from driver.queue.command_index import StoredCommand
from driver.queue.journal import Journal
from driver.queue.schema import SEQ_BLOCK

log = logs.get("driver.outbox.writer")

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
# A commit that fails (disk full, I/O error) is retried with everything it took, after this backoff.
RETRY_MIN_S, RETRY_MAX_S = 0.05, 5.0

# One journal row in JournaledEvent's column order (seq, event_id, run_id, kind, body): plain tuples,
# because a NamedTuple's __new__ costs µs per event.
Row = tuple[int, str, str | None, str, bytes]


class Saved:
    """A command status waiting for its commit: `done` is set once it is durable."""

    __slots__ = ("command", "done", "fact_seq", "gen")

    def __init__(self, command: StoredCommand, fact_seq: int | None, gen: int) -> None:
        self.command = command
        self.fact_seq = fact_seq  # the seq of its command.finished, journaled in the same transaction
        self.gen = gen
        self.done = anyio.Event()


class Writer:
    def __init__(self, journal: Journal, on_journaled: Callable[[list[Row]], None], after: Callable[[], None]) -> None:
        """`on_journaled(rows)` runs once rows are durable; `after()` at the end of every commit."""
        self.journal = journal
        self._on_journaled = on_journaled
        self._after = after
        # Admitted, not yet journaled, oldest first. Their bodies cannot be evicted until written.
        self.unsynced: deque[Row] = deque()
        self.unsynced_bytes = 0
        self._statuses: deque[Saved] = deque()
        self._to_delete: list[int] = []
        self._aside: list[tuple[int, str]] = []
        self._cuts: list[tuple[int, bytes]] = []
        self._writing = 0  # a transaction in progress (`drained` means gone from disk)
        self._seq_next, self._seq_end = journal.reserve_seqs()
        self._reserve_target = 0  # a reservation riding on the next group commit (0: none)
        # Progress marks for flush(): the last seq appended / made durable, and a generation counted
        # for every other queued write (statuses, deletions, set-asides, cuts, reservations).
        self._appended_seq = 0
        self._durable_seq = 0
        self._gen = 0
        self._durable_gen = 0
        self._commit_lock = anyio.Lock()
        self._running = False
        self._retry_s = 0.0
        self._work = anyio.Event()
        self._work_due = False
        self.committed = anyio.Event()  # set (and replaced) after each group commit that wrote events
        self._progress = anyio.Event()  # set (and replaced) after every commit attempt
        self._deletions = anyio.Event()  # set when a deletion waits for a commit (see DELETE_FLUSH_S)

    @property
    def first_seq(self) -> int:
        """The first seq this process may stamp: above every seq an earlier process reserved."""
        return self._seq_next

    @property
    def busy(self) -> bool:
        """Anything queued that is not yet written, or a write in progress."""
        return bool(self.unsynced or self._statuses or self._to_delete or self._aside or self._cuts or self._writing)

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
            self._gen += 1
            self.kick()

    # -- queueing -------------------------------------------------------------------------------------
    def append(self, row: Row, status: StoredCommand | None = None) -> Saved | None:
        """Queue an admitted event; with `status`, the command status it is the fact of (one commit)."""
        self.unsynced.append(row)
        self.unsynced_bytes += len(row[4])
        self._appended_seq = row[0]
        saved = None
        if status is not None:
            self._gen += 1
            saved = Saved(status, row[0], self._gen)
            self._statuses.append(saved)
        self.kick()
        return saved

    def save_status(self, status: StoredCommand) -> Saved:
        """Queue a status that has no fact event (`accepted`); the caller awaits `.done`."""
        self._gen += 1
        saved = Saved(status, None, self._gen)
        self._statuses.append(saved)
        self.kick()
        return saved

    def delete(self, seq: int, *, now: bool = False) -> None:
        """Delete `seq`'s row with the next group commit, or in a commit of its own when `now` (or
        after DELETE_FLUSH_S without one)."""
        self._to_delete.append(seq)
        self._gen += 1
        if now or len(self._to_delete) >= DELETE_BATCH_MAX:
            self.kick()
        else:
            self._deletions.set()

    def set_aside(self, seq: int, reason: str) -> None:
        """Move `seq`'s row (it failed its check) to the set-aside table, with the next commit."""
        self._aside.append((seq, reason))
        self._gen += 1
        self.kick()

    def replace(self, seq: int, body: bytes) -> None:
        """Journal the cut form of a journaled event (PROTOCOL §4.3) with the next commit."""
        self._cuts.append((seq, body))
        self._gen += 1
        self.kick()

    def flush_deletions(self) -> None:
        """Commit the waiting deletions now, not after DELETE_FLUSH_S."""
        if self._to_delete:
            self.kick()

    def kick(self) -> None:
        """Wake the writer (once per group commit, not once per event: this is on the hot path)."""
        if not self._work_due:
            self._work_due = True
            self._work.set()

    # -- the writer task ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Every commit, for the process's life."""
        self._running = True
        try:
            async with tasks.within("outbox writer") as tg:
                tg.spawn(self._flush_deletions_when_idle)
                while True:
                    await self._work.wait()
                    self._work = anyio.Event()
                    self._work_due = False
                    await self._commit(COMMIT_MAX_EVENTS)
                    if self.unsynced or self._statuses or self._aside or self._cuts or self._reserve_target:
                        self.kick()  # a flood: commit the rest next, so sending starts with the first chunk
        finally:
            self._running = False

    async def _flush_deletions_when_idle(self) -> None:
        """Commit waiting deletions alone when no admitted event carried them within DELETE_FLUSH_S."""
        while True:
            await self._deletions.wait()
            self._deletions = anyio.Event()
            await anyio.sleep(DELETE_FLUSH_S)
            self.flush_deletions()

    def _covered(self, seq: int, gen: int) -> bool:
        return self._durable_seq >= seq and self._durable_gen >= gen

    async def flush(self) -> None:
        """Wait until everything queued so far is durable (events, statuses, deletions, a reservation)."""
        seq, gen = self._appended_seq, self._gen
        while not self._covered(seq, gen):
            if self._running:
                progress = self._progress
                self.kick()
                await progress.wait()
            else:
                await self._commit(COMMIT_MAX_EVENTS)

    async def _commit(self, limit: int) -> None:
        """One transaction: the oldest `limit` events, the statuses whose facts are among them or that
        have none, every deletion, set-aside and cut, and a due reservation."""
        async with self._commit_lock:
            take = min(limit, len(self.unsynced))
            rows = [self.unsynced.popleft() for _ in range(take)]
            # Counted out as the commit starts (not when it ends): a producer waiting on the byte cap
            # then admits the next chunk while this one is being written, so journaling overlaps.
            taken_bytes = sum(len(r[4]) for r in rows)
            self.unsynced_bytes -= taken_bytes
            last = rows[-1][0] if rows else self._durable_seq
            statuses: list[Saved] = []
            later: deque[Saved] = deque()
            for s in self._statuses:
                (statuses if s.fact_seq is None or s.fact_seq <= last else later).append(s)
            self._statuses = later
            gen = self._gen if not later else later[0].gen - 1
            deletes, self._to_delete = self._to_delete, []
            aside, self._aside = self._aside, []
            cuts, self._cuts = self._cuts, []
            reserve = self._reserve_target
            progress, self._progress = self._progress, anyio.Event()
            if not (rows or statuses or deletes or aside or cuts or reserve):
                self._durable_gen = max(self._durable_gen, gen)
                progress.set()
                self._after()
                return
            self._writing += 1
            try:
                await anyio.to_thread.run_sync(
                    self.journal.commit, rows, deletes, reserve, [s.command for s in statuses], aside, cuts
                )
            except Exception as exc:
                # Nothing is dropped: everything goes back, in order, and is retried after a backoff.
                self._requeue(rows, statuses, deletes, aside, cuts)
                self.unsynced_bytes += taken_bytes
                log.error("journal.commit_failed", error=type(exc).__name__, detail=str(exc)[:200])
                progress.set()
                self._retry_s = min(RETRY_MAX_S, max(RETRY_MIN_S, self._retry_s * 2))
                await anyio.sleep(self._retry_s)
                return
            finally:
                self._writing -= 1
            self._retry_s = 0.0
            self._durable_seq = max(self._durable_seq, last)
            self._durable_gen = max(self._durable_gen, gen)
            if reserve and reserve >= self._seq_end:
                self._seq_end = reserve + 1
                if self._reserve_target == reserve:
                    self._reserve_target = 0
            for s in statuses:
                s.done.set()
            if rows:
                self._on_journaled(rows)
                self.committed.set()
                self.committed = anyio.Event()
            progress.set()
            self._after()

    def _requeue(
        self,
        rows: list[Row],
        statuses: list[Saved],
        deletes: list[int],
        aside: list[tuple[int, str]],
        cuts: list[tuple[int, bytes]],
    ) -> None:
        self.unsynced.extendleft(reversed(rows))
        merged = sorted([*statuses, *self._statuses], key=lambda s: s.gen)
        self._statuses = deque(merged)
        self._to_delete = deletes + self._to_delete
        self._aside = aside + self._aside
        self._cuts = cuts + self._cuts
