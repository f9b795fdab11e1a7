"""The outbox of PROTOCOL §4.1: admission, group-committed journaling, batching, receipts, retries.

Lossless events get a seq and event_id at admission, are written to the journal by a group-commit
writer (one transaction and one fsync for everything admitted meanwhile), and only then become
sendable. They leave only when a receipt accepts them or rejects them finally. Best-effort events
live in a small bounded buffer (`BestEffortBuffer`), are never journaled and are sent at most once.

`admit` returns once the event has its seq and is queued for the next group commit; it does not wait
for the fsync, so a producer is never serialised on disk latency. Nothing is sent before it is durable.
When the outbox is full (count or bytes) `admit` waits: that is the backpressure on the provider.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from driver.protocol.events import Delivery, Event, event_id_for
from driver.protocol.frames import Receipt, Rejection
from driver.protocol.oversize import shrink_event
from driver.queue.best_effort import BestEffortBuffer, BestEffortEvent
from driver.queue.journal import Journal
from driver.queue.outbox_types import (
    IN_FLIGHT,
    READY,
    WAITING,
    Batch,
    FinalRejection,
    OutboxStats,
    RetryPolicy,
    _Entry,
    utc_now,
)
from driver.queue.schema import RUN_TERMINAL_KINDS, SEQ_BLOCK

log = logging.getLogger("driver.outbox")

# The records moved to outbox_types; importers keep taking them from here.
__all__ = ["Batch", "FinalRejection", "Outbox", "OutboxStats", "RetryPolicy", "utc_now"]

# Events per group commit at most. Under a flood, one huge transaction would make every event wait
# for the last one before the first is sent; chunks let sending overlap journaling.
COMMIT_MAX_EVENTS = 1024
# Bytes of admitted events not yet journaled before `admit` waits for the writer.
UNSYNCED_MAX_BYTES = 4 * 1024 * 1024
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
# written while later batches are on the wire, as before.
DELETE_BATCH_MAX = 512


_encoder = msgspec.json.Encoder()


@dataclass
class Outbox:
    journal: Journal
    instance_id: str
    session_id: str
    epoch: int
    max_events: int = 100_000
    max_bytes: int = 256 * 1024 * 1024
    resident_bytes_cap: int = 8 * 1024 * 1024
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.monotonic
    best_effort: BestEffortBuffer = field(default_factory=BestEffortBuffer)

    def __post_init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self._ready: list[int] = []  # heap of seqs
        self._waiting: list[tuple[float, int]] = []  # heap of (ready_at, seq)
        self._in_flight: dict[int, tuple[float, list[int], list[BestEffortEvent]]] = {}
        self._unsynced: deque[_Entry] = deque()
        self._to_delete: list[int] = []
        self._deleting = 0
        self._bytes = 0
        self._resident = 0
        self._batch_no = 0
        self._seq_next, self._seq_end = self.journal.reserve_seqs()
        self._reserve_target = 0  # a reservation riding on the next group commit (0: none)
        self._sendable = anyio.Event()
        self._work = anyio.Event()
        self._space = anyio.Event()
        self._space_waiters = 0
        self._committed = anyio.Event()  # set (and replaced) after each group commit that wrote events
        self._unsynced_bytes = 0
        self._work_due = False
        self._drained = anyio.Event()
        self._drain_waiters = 0
        self._deletions = anyio.Event()  # set when a deletion waits for a commit (see DELETE_FLUSH_S)
        self._receipt_waiters: dict[str, anyio.Event] = {}
        self._receipt_outcomes: dict[str, str] = {}
        self.stats = OutboxStats()
        self.local_rejections: list[FinalRejection] = []
        self.link_up = False
        now = self.clock()
        for seq, event_id, run_id, kind, size in self.journal.pending():
            entry = _Entry(seq, event_id, run_id, kind, size, None, now, READY)
            self._entries[seq] = entry
            self._bytes += size
            self._ready.append(seq)
        heapq.heapify(self._ready)
        self._recovered = len(self._entries)

    # -- admission ----------------------------------------------------------------------------------
    @property
    def recovered(self) -> int:
        """How many lossless events this process found journaled at start."""
        return self._recovered

    async def _next_seq(self) -> int:
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
            self._kick()

    def _full(self) -> bool:
        return len(self._entries) >= self.max_events or self._bytes >= self.max_bytes

    async def admit(self, kind: str, payload: bytes, delivery: Delivery, run_id: str | None) -> str:
        """Stamp and queue one event; return its event_id. Waits while the outbox is full."""
        if delivery == "best_effort":
            seq = await self._next_seq()
            event_id = event_id_for(self.instance_id, self.epoch, seq)
            if self.link_up:
                self.best_effort.add(BestEffortEvent(seq, event_id, run_id, kind, payload, utc_now()))
                self._sendable.set()
            else:
                self.best_effort.count_drop(run_id)
            return event_id
        while self._full():
            self._space = anyio.Event() if self._space.is_set() else self._space
            self._space_waiters += 1
            try:
                await self._space.wait()
            finally:
                self._space_waiters -= 1
        while self._unsynced_bytes > UNSYNCED_MAX_BYTES:
            # Bodies not yet journaled cannot be evicted: a producer faster than the disk waits for the
            # writer here, so memory stays bounded by the disk's pace, not by the producer's speed.
            await self._committed.wait()
        seq = await self._next_seq()
        event_id = event_id_for(self.instance_id, self.epoch, seq)
        # Positional, in Event's field order (event_id, seq, epoch, kind, delivery, session_id,
        # run_id, occurred_at, payload): this line runs for every lossless event.
        body = _encoder.encode(
            Event(event_id, seq, self.epoch, kind, delivery, self.session_id, run_id, utc_now(), msgspec.Raw(payload))
        )
        entry = _Entry(seq, event_id, run_id, kind, len(body), body, self.clock())
        self._entries[seq] = entry
        self._bytes += entry.size
        self._resident += entry.size
        self._unsynced.append(entry)
        self._unsynced_bytes += entry.size
        self._kick()
        return event_id

    # -- the writer task ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Group commits and deletions; run for the process's life inside the kernel's task group."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._flush_deletions_when_idle)
            while True:
                await self._work.wait()
                self._work = anyio.Event()
                self._work_due = False
                await self._commit(COMMIT_MAX_EVENTS)
                if self._unsynced:
                    self._kick()  # a flood: commit the rest next, so sending starts with the first chunk

    async def _flush_deletions_when_idle(self) -> None:
        """Commit waiting deletions alone when no admitted event carried them within DELETE_FLUSH_S."""
        while True:
            await self._deletions.wait()
            self._deletions = anyio.Event()
            await anyio.sleep(DELETE_FLUSH_S)
            if self._to_delete:
                self._kick()

    def _kick(self) -> None:
        """Wake the writer (once per group commit, not once per event: this is on the hot path)."""
        if not self._work_due:
            self._work_due = True
            self._work.set()

    async def flush(self) -> None:
        """Make everything admitted so far durable, apply pending deletions and extend the seq
        reservation when one is due."""
        remaining = len(self._unsynced)
        while True:
            await self._commit(COMMIT_MAX_EVENTS)
            remaining -= COMMIT_MAX_EVENTS
            if remaining <= 0:
                return

    async def _commit(self, limit: int) -> None:
        """One transaction: up to `limit` admitted events, every pending deletion, a due reservation."""
        take = min(limit, len(self._unsynced))
        batch = [self._unsynced.popleft() for _ in range(take)]
        self._unsynced_bytes -= sum(e.size for e in batch)
        deletes, self._to_delete = self._to_delete, []
        reserve = self._reserve_target
        if batch or deletes or reserve:
            # Plain tuples in JournaledEvent's column order: a NamedTuple's __new__ costs µs per event.
            rows = [(e.seq, e.event_id, e.run_id, e.kind, e.body or b"") for e in batch]
            self._deleting += 1  # `drained()` waits for these too: "drained" means gone from disk
            try:
                await anyio.to_thread.run_sync(self.journal.commit, rows, deletes, reserve)
            finally:
                self._deleting -= 1
            if reserve and reserve >= self._seq_end:
                self._seq_end = reserve + 1
                if self._reserve_target == reserve:
                    self._reserve_target = 0
            for e in batch:
                if e.seq not in self._entries:
                    continue  # receipted while being written (cannot happen before send; kept for safety)
                e.state = READY
                heapq.heappush(self._ready, e.seq)
                if self._resident > self.resident_bytes_cap and e.body is not None:
                    # Backlog beyond the resident budget lives only on disk; re-read when sent.
                    e.body = None
                    self._resident -= e.size
            if batch:
                self._sendable.set()
                self._committed.set()
                self._committed = anyio.Event()
        self._check_drained()

    # -- sending ------------------------------------------------------------------------------------
    async def wait_sendable(self) -> None:
        while not self._has_sendable():
            self._sendable = anyio.Event()
            await self._sendable.wait()

    def _has_sendable(self) -> bool:
        return bool(self._ready) or (self.link_up and len(self.best_effort) > 0)

    def take_batch(self, max_events: int, max_bytes: int) -> Batch | None:
        """The next batch: ready lossless events oldest seq first, then buffered best-effort events."""
        seqs: list[int] = []
        picked: list[_Entry] = []
        size = 0
        while self._ready and len(picked) < max_events:
            seq = self._ready[0]
            entry = self._entries.get(seq)
            if entry is None or entry.state != READY:
                heapq.heappop(self._ready)
                continue
            if picked and size + entry.size + 64 > max_bytes:
                break
            if not picked and entry.size + 64 > max_bytes and not self._fit(entry, max_bytes - 64):
                heapq.heappop(self._ready)
                continue  # finally rejected here: never sent again
            heapq.heappop(self._ready)
            picked.append(entry)
            seqs.append(seq)
            size += entry.size + 1
        missing = [e.seq for e in picked if e.body is None]
        loaded = self.journal.bodies(missing) if missing else {}
        bodies: list[bytes] = []
        for e in picked:
            body = e.body if e.body is not None else loaded.get(e.seq)
            if body is None:  # deleted meanwhile: nothing to send
                continue
            bodies.append(body)
        # Best-effort events fill what is left, measured by their real encoding; 64 bytes stay for the
        # frame's own envelope, as for the lossless events above.
        taken = (
            self.best_effort.take(
                max_events - len(bodies),
                max_bytes - size - 64,
                lambda b: b.encode(self.epoch, self.session_id),
                fill=bool(bodies),
            )
            if self.link_up
            else []
        )
        be = [b for b, _ in taken]
        if not bodies and not be:
            return None
        self._batch_no += 1
        now = self.clock()
        for e in picked:
            if e.attempts:
                self.stats.retries += 1
            e.attempts += 1
            e.state = IN_FLIGHT
            e.batch = self._batch_no
        frame_events = bodies + [encoded for _, encoded in taken]
        self._in_flight[self._batch_no] = (now + self.retry.receipt_timeout, seqs, be)
        return Batch(self._batch_no, frame_events, seqs, be)

    def _fit(self, entry: _Entry, limit: int) -> bool:
        """PROTOCOL §4.3 for an event journaled larger than a frame may be (an older driver's, or one
        refused with 1009): cut its payload to fit, journal the cut form, and send that from now on.
        When it cannot be cut, reject it finally here, as the CP would (False)."""
        body = entry.body if entry.body is not None else self.journal.bodies([entry.seq]).get(entry.seq)
        new = shrink_event(body, limit) if body is not None else None
        if new is None:
            self._remove(entry, "rejected")
            self.journal.delete([entry.seq])  # before it is reported, as for a CP's final rejection
            self.stats.final_rejections += 1
            message = f"the event is {entry.size} bytes and cannot be cut to {limit}"
            rejection = Rejection(entry.event_id, "event.too_large", message, False)
            self.local_rejections.append(FinalRejection(entry.event_id, entry.kind, entry.run_id, rejection))
            return False
        self.journal.replace_body(entry.seq, new)
        self._bytes += len(new) - entry.size
        if entry.body is not None:
            self._resident += len(new) - entry.size
        entry.body, entry.size = new, len(new)
        log.warning("event.cut_to_fit", extra={"event_id": entry.event_id, "bytes": len(new), "limit": limit})
        return True

    def reject_oldest(self, code: str, message: str) -> list[FinalRejection]:
        """Finally reject the oldest pending lossless event (one no frame can carry)."""
        if not self._entries:
            return []
        entry = self._entries[min(self._entries)]
        self._remove(entry, "rejected")
        self.journal.delete([entry.seq])  # before it is reported, as for a CP's final rejection
        self.stats.final_rejections += 1
        return [
            FinalRejection(entry.event_id, entry.kind, entry.run_id, Rejection(entry.event_id, code, message, False))
        ]

    def take_local_rejections(self) -> list[FinalRejection]:
        """Events this outbox finally rejected itself (too large even when cut), for the caller to report."""
        out, self.local_rejections = self.local_rejections, []
        return out

    # -- receipts -----------------------------------------------------------------------------------
    def on_receipt(self, receipt: Receipt) -> list[FinalRejection]:
        """Apply a receipt, matched by event_id. Returns the final rejections for the caller to report."""
        finals: list[FinalRejection] = []
        accepted = set(receipt.accepted)
        by_id = {r.event_id: r for r in receipt.rejected}
        flight = self._in_flight.pop(receipt.batch, None)
        seqs = flight[1] if flight else []
        if flight:
            for b in flight[2]:
                if b.event_id not in accepted:
                    self.best_effort.count_drop(b.run_id, b.pieces)
        for event_id in accepted:
            if (entry := self._lookup(event_id)) is not None:
                self._remove(entry, "accepted")
        for event_id, rej in by_id.items():
            if (entry := self._lookup(event_id)) is None:
                continue
            if not rej.retryable:
                self._remove(entry, "rejected")
                self.stats.final_rejections += 1
                finals.append(FinalRejection(entry.event_id, entry.kind, entry.run_id, rej))
                # Gone from disk before it is reported: a crash right after the report must not make
                # the next process resend it and report the same final rejection again (rare path).
                self.journal.delete([entry.seq])
            elif entry.state == IN_FLIGHT:
                self._wait_retry(entry)
        # Events of this batch in neither list were not stored: resend after a backoff.
        for seq in seqs:
            entry = self._entries.get(seq)
            if entry is not None and entry.state == IN_FLIGHT and entry.batch == receipt.batch:
                self._wait_retry(entry)
        self._sendable.set()
        return finals

    def _lookup(self, event_id: str) -> _Entry | None:
        """The pending entry for `event_id`. Its seq is the id's last part, so no second index is kept."""
        try:
            seq = int(event_id.rpartition("/")[2])
        except ValueError:
            return None
        entry = self._entries.get(seq)
        return entry if entry is not None and entry.event_id == event_id else None

    def _remove(self, entry: _Entry, outcome: str) -> None:
        del self._entries[entry.seq]
        self._bytes -= entry.size
        if entry.body is not None:
            self._resident -= entry.size
        self._to_delete.append(entry.seq)
        if (self._drain_waiters and not self._entries) or len(self._to_delete) >= DELETE_BATCH_MAX:
            self._kick()  # someone waits for the outbox to be empty on disk, or a flood's deletions pile up
        else:
            self._deletions.set()  # rides on the next group commit (DELETE_FLUSH_S)
        if (waiter := self._receipt_waiters.pop(entry.event_id, None)) is not None:
            self._receipt_outcomes[entry.event_id] = outcome
            waiter.set()
        if self._space_waiters and not self._full():
            self._space.set()

    def _wait_retry(self, entry: _Entry) -> None:
        entry.state = WAITING
        heapq.heappush(self._waiting, (self.clock() + self.retry.delay(entry.attempts), entry.seq))

    def expire(self) -> float | None:
        """Time out unreceipted batches and release due retries. Returns seconds until the next due time."""
        now = self.clock()
        for number, (deadline, seqs, be) in list(self._in_flight.items()):
            if deadline <= now:
                del self._in_flight[number]
                for b in be:
                    self.best_effort.count_drop(b.run_id, b.pieces)
                for seq in seqs:
                    entry = self._entries.get(seq)
                    if entry is not None and entry.state == IN_FLIGHT and entry.batch == number:
                        self._wait_retry(entry)
        released = False
        while self._waiting and self._waiting[0][0] <= now:
            _, seq = heapq.heappop(self._waiting)
            entry = self._entries.get(seq)
            if entry is not None and entry.state == WAITING:
                entry.state = READY
                heapq.heappush(self._ready, seq)
                released = True
        if released:
            self._sendable.set()
        nexts = [d for d, _, _ in self._in_flight.values()]
        if self._waiting:
            nexts.append(self._waiting[0][0])
        return max(0.0, min(nexts) - now) if nexts else None

    # -- link state ---------------------------------------------------------------------------------
    def on_link_up(self) -> None:
        self.link_up = True
        self._sendable.set()

    def on_link_down(self) -> None:
        """Everything in flight goes back to be resent after the next welcome, oldest first."""
        self.link_up = False
        for _, _seqs, be in self._in_flight.values():
            for b in be:
                self.best_effort.count_drop(b.run_id, b.pieces)
        self._in_flight.clear()
        self.best_effort.drop_all()
        for entry in self._entries.values():
            if entry.state in (IN_FLIGHT, WAITING):
                entry.state = READY
                entry.attempts = 0
                heapq.heappush(self._ready, entry.seq)
        self._waiting.clear()

    # -- waiting on outcomes ------------------------------------------------------------------------
    def watch(self, event_id: str) -> None:
        """Register interest in `event_id`'s receipt before it can possibly arrive."""
        if event_id not in self._receipt_outcomes:
            self._receipt_waiters.setdefault(event_id, anyio.Event())

    async def receipted(self, event_id: str) -> str:
        """Wait until `event_id` was accepted or finally rejected; returns "accepted" or "rejected"."""
        self.watch(event_id)
        waiter = self._receipt_waiters.get(event_id)
        if waiter is not None:
            await waiter.wait()
        return self._receipt_outcomes.pop(event_id, "accepted")

    def _check_drained(self) -> None:
        if not self._entries and not self._unsynced and not self._to_delete and not self._deleting:
            # Wake every waiter, and start a fresh event for the next time the outbox empties.
            self._drained.set()
            self._drained = anyio.Event()

    async def drained(self) -> None:
        """Wait until no lossless event is left without a receipt (and the deletions are journaled)."""
        self._drain_waiters += 1
        try:
            while self._entries or self._unsynced or self._to_delete or self._deleting:
                if not self._entries and self._to_delete:
                    self._kick()  # the last deletions: committed now, not after DELETE_FLUSH_S
                await self._drained.wait()
        finally:
            self._drain_waiters -= 1

    # -- statistics ---------------------------------------------------------------------------------
    def snapshot(self) -> OutboxStats:
        s = self.stats
        s.lossless_pending = len(self._entries)
        s.in_flight = sum(len(seqs) for _, seqs, _ in self._in_flight.values())
        first = next(iter(self._entries.values()), None)
        s.oldest_pending_seq = first.seq if first else None
        s.oldest_pending_age_ms = int((self.clock() - first.admitted_at) * 1000) if first else None
        s.best_effort_dropped = self.best_effort.dropped
        s.best_effort_buffered = len(self.best_effort)
        return s

    def pending_terminal_of(self, run_id: str) -> str | None:
        """The event_id of `run_id`'s terminal while it is still unreceipted (restart recovery)."""
        for entry in self._entries.values():
            if entry.run_id == run_id and entry.kind in RUN_TERMINAL_KINDS:
                return entry.event_id
        return None

    def dropped_for_run(self, run_id: str) -> int:
        return self.best_effort.dropped_for(run_id)

    @property
    def pending_count(self) -> int:
        return len(self._entries)

    def describe(self) -> dict[str, Any]:
        s = self.snapshot()
        return {
            "lossless_pending": s.lossless_pending,
            "in_flight": s.in_flight,
            "oldest_pending_seq": s.oldest_pending_seq,
            "oldest_pending_age_ms": s.oldest_pending_age_ms,
            "retries": s.retries,
            "best_effort_dropped": s.best_effort_dropped,
            "final_rejections": s.final_rejections,
        }
