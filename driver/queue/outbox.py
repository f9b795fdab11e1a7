"""The outbox of PROTOCOL §4.1: admission, group-committed journaling, batching, receipts, retries.

Lossless events get a seq and event_id at admission, are written to the journal by a group-commit
writer (one transaction and one fsync for everything admitted meanwhile), and only then become
sendable. They leave only when a receipt accepts them or rejects them finally. Best-effort events
live in a small bounded buffer (`BestEffortBuffer`), are never journaled and are sent at most once.

`admit` returns once the event has its seq and is queued for the next group commit; it does not wait
for the fsync, so a producer is never serialised on disk latency. Nothing is sent before it is durable.
When the outbox is full (count or bytes) `admit` waits: that is the backpressure on the provider.

Memory per pending event is a few dozen bytes (issue 10): the per-event state lives in typed arrays
(`pending.PendingIndex`), ids are derived (`event_ids.EventIds`), and bodies live in the journal. Only
bodies not yet journaled, and up to `resident_bytes_cap` of journaled ones committed while the link is
up (the ones about to be sent), stay in memory; the rest is read back when it is sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec

from driver import logs
from driver.protocol.events import Delivery, Event, event_id_for
from driver.protocol.frames import Receipt, Rejection
from driver.protocol.oversize import shrink_event
from driver.queue.best_effort import BestEffortBuffer, BestEffortEvent
from driver.queue.bodies import Bodies
from driver.queue.command_index import StoredCommand
from driver.queue.deliveries import Deliveries
from driver.queue.event_ids import EventIds
from driver.queue.journal import Journal
from driver.queue.journal_rows import Finding
from driver.queue.outbox_types import Batch, FinalRejection, OutboxStats, RetryPolicy, utc_now
from driver.queue.outbox_writer import Row, Writer
from driver.queue.pending import IN_FLIGHT, READY, UNSYNCED, PendingIndex
from driver.queue.receipt_waiters import ReceiptWaiters
from driver.queue.schema import RUN_TERMINAL_KINDS

log = logs.get("driver.outbox")

# The records moved to outbox_types; importers keep taking them from here.
__all__ = ["Batch", "FinalRejection", "Outbox", "OutboxStats", "RetryPolicy", "utc_now"]

# Bytes of admitted events not yet journaled before `admit` waits for the writer.
UNSYNCED_MAX_BYTES = 4 * 1024 * 1024

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
        self.stats = OutboxStats()
        self._index = PendingIndex()
        self._ids = EventIds(self.instance_id)
        self._writer = Writer(self.journal, self._journaled, self._check_drained)
        self._deliveries = Deliveries(self._index, self.retry, self.clock, self.best_effort, self.stats)
        self._bodies = Bodies(self.journal, self._writer, self.resident_bytes_cap)
        self._terminals: dict[int, str] = {}  # seq → run_id of pending run terminals (a few at most)
        self._origin = self.clock()
        self._sendable = anyio.Event()
        self._space = anyio.Event()
        self._space_waiters = 0
        self._drained = anyio.Event()
        self._drain_waiters = 0
        self._waiters = ReceiptWaiters()
        self.local_rejections: list[FinalRejection] = []
        # Rows that failed their check when read back (set aside, never sent): for the kernel to report.
        self.findings: list[Finding] = []
        self.on_findings: Callable[[], None] = lambda: None
        self.link_up = False
        for seq, event_id, run_id, kind, size in self.journal.pending():
            self._ids.recover(seq, event_id)
            self._index.add(seq, size, READY, 0)
            if run_id is not None and kind in RUN_TERMINAL_KINDS:
                self._terminals[seq] = run_id
        self._recovered = len(self._index)
        self._ids.add(self._writer.first_seq, self.epoch)

    # -- admission ----------------------------------------------------------------------------------
    @property
    def recovered(self) -> int:
        """How many lossless events this process found journaled at start."""
        return self._recovered

    def _full(self) -> bool:
        return self._index.live >= self.max_events or self._index.bytes >= self.max_bytes

    def _now_cs(self) -> int:
        return int((self.clock() - self._origin) * 100)

    async def save_status(self, status: StoredCommand) -> None:
        """Journal a command status that has no fact event (`accepted`), through the one writer;
        return once it is durable."""
        await self._writer.save_status(status).done.wait()

    async def admit(
        self, kind: str, payload: bytes, delivery: Delivery, run_id: str | None, status: StoredCommand | None = None
    ) -> str:
        """Stamp and queue one event; return its event_id. Waits while the outbox is full.

        With `status` (a command's terminal status, whose fact this event is: PROTOCOL §4.1), both are
        journaled in ONE transaction and this returns only once they are durable."""
        if delivery == "best_effort":
            seq = await self._writer.next_seq()
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
        while self._writer.unsynced_bytes > UNSYNCED_MAX_BYTES:
            # Bodies not yet journaled cannot be evicted: a producer faster than the disk waits for the
            # writer here, so memory stays bounded by the disk's pace, not by the producer's speed.
            await self._writer.committed.wait()
        seq = await self._writer.next_seq()
        event_id = event_id_for(self.instance_id, self.epoch, seq)
        # Positional, in Event's field order (event_id, seq, epoch, kind, delivery, session_id,
        # run_id, occurred_at, payload): this line runs for every lossless event.
        body = _encoder.encode(
            Event(event_id, seq, self.epoch, kind, delivery, self.session_id, run_id, utc_now(), msgspec.Raw(payload))
        )
        # No await since the seq was stamped: events enter the index in seq order.
        self._index.add(seq, len(body), UNSYNCED, self._now_cs())
        if run_id is not None and kind in RUN_TERMINAL_KINDS:
            self._terminals[seq] = run_id
        saved = self._writer.append((seq, event_id, run_id, kind, body), status)
        if saved is not None:
            with anyio.CancelScope(shield=True):  # queued already: the caller learns when it is durable
                await saved.done.wait()
        return event_id

    # -- the writer ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Group commits and deletions; run for the process's life inside the kernel's task group."""
        await self._writer.run()

    async def flush(self) -> None:
        """Make everything admitted so far durable (and the deletions, and a due seq reservation)."""
        await self._writer.flush()

    def _journaled(self, rows: list[Row]) -> None:
        """`rows` are durable: make them sendable, and keep their bodies while the budget allows and the
        link is up (they are sent next; with the link down they would only wait, so they are not kept)."""
        index = self._index
        # Unjournaled events are the newest and are never removed (nothing unsent can be receipted, see
        # `_find_sent`), so a commit's rows, the oldest of them, sit side by side in the index.
        first = index.find(rows[0][0])
        last = first + len(rows) - 1
        if first >= 0 and last < len(index.seqs) and index.seqs[last] == rows[-1][0]:
            index.set_ready_range(first, last + 1)
        else:  # not expected; stay correct anyway
            for row in rows:
                if (i := index.find(row[0])) >= 0:
                    index.set_ready(i)
        self._sendable.set()
        if self.link_up:
            self._bodies.keep(rows)

    # -- sending ------------------------------------------------------------------------------------
    async def wait_sendable(self) -> None:
        while not (self._index.next_ready() >= 0 or (self.link_up and len(self.best_effort) > 0)):
            self._sendable = anyio.Event()
            await self._sendable.wait()

    def take_batch(self, max_events: int, max_bytes: int) -> Batch | None:
        """The next batch: ready lossless events oldest seq first, then buffered best-effort events."""
        index = self._index
        picked: list[int] = []  # indices into the pending index
        size = 0
        # The next READY one after i is a memchr over the states (no compaction happens in here).
        states, sizes = index.states, index.sizes
        i = index.next_ready()
        while i >= 0 and len(picked) < max_events:
            event_size = sizes[i]
            if picked and size + event_size + 64 > max_bytes:
                break
            if not picked and event_size + 64 > max_bytes:
                if not self._fit(i, max_bytes - 64):
                    i = states.find(READY, i + 1)
                    continue  # finally rejected here: never sent again
                event_size = sizes[i]
            picked.append(i)
            size += event_size + 1
            i = states.find(READY, i + 1)
        loaded, tampered = self._bodies.get_many([index.seqs[i] for i in picked])
        bodies: list[bytes] = []
        sent: list[int] = []
        for i in picked:
            seq = index.seqs[i]
            if seq in tampered:
                self._set_aside(i, "mac")
                continue
            if (body := loaded.get(seq)) is None:
                # Gone from the journal under us (nothing of ours deletes a pending event's row): it
                # can never be sent, by this process or the next. Reported like a final rejection
                # (a log line and a diagnostic) rather than retried forever or dropped silently.
                event_id, message = self._ids.of(seq), "its journal row is gone"
                rejection = Rejection(event_id, "event.body_missing", message, False)
                self.local_rejections.append(FinalRejection(event_id, "", None, rejection))
                self._remove(i, "rejected")
                continue
            bodies.append(body)
            sent.append(i)
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
        number, seqs = self._deliveries.start(sent, be)
        return Batch(number, bodies + [encoded for _, encoded in taken], seqs, be)

    def _set_aside(self, i: int, reason: str) -> None:
        """The row of event `i` failed its check (PROTOCOL §9): never sent, set aside, reported."""
        seq = self._index.seqs[i]
        self.findings.append(Finding("outbox", str(seq), reason))
        log.error("journal.tampered", table="outbox", seq=seq, reason=reason)
        self._remove(i, "rejected", delete=False)
        self._writer.set_aside(seq, reason)
        self._bodies.tampered.discard(seq)
        self.on_findings()

    def take_findings(self) -> list[Finding]:
        out, self.findings = self.findings, []
        return out

    def _fit(self, i: int, limit: int) -> bool:
        """PROTOCOL §4.3 for an event journaled larger than a frame may be (an older driver's, or one
        refused with 1009): cut its payload to fit, journal the cut form, and send that from now on.
        When it cannot be cut, reject it finally here, as the CP would (False)."""
        seq, size = self._index.seqs[i], self._index.sizes[i]
        body = self._bodies.get(seq)
        if body is None and seq in self._bodies.tampered:
            self._set_aside(i, "mac")
            return False
        new = shrink_event(body, limit) if body is not None else None
        if new is None:
            message = f"the event is {size} bytes and cannot be cut to {limit}"
            self.local_rejections.append(self._reject_here(i, "event.too_large", message))
            return False
        self._bodies.replace(seq, new)
        self._index.resize(i, len(new))
        log.warning("event.cut_to_fit", event_id=self._ids.of(seq), bytes=len(new), limit=limit)
        return True

    def reject_oldest(self, code: str, message: str) -> list[FinalRejection]:
        """Finally reject the oldest pending lossless event (one no frame can carry). Only a journaled
        one: an event not yet journaled was never sent, so it cannot be the one refused."""
        i = self._index.oldest_journaled()
        return [self._reject_here(i, code, message)] if i >= 0 else []

    def _reject_here(self, i: int, code: str, message: str) -> FinalRejection:
        seq = self._index.seqs[i]
        event_id = self._ids.of(seq)
        meta = self._bodies.meta(seq)
        # Deleted before it is reported, as for a CP's final rejection: the report is admitted after
        # this, so the one writer commits the deletion in the same transaction or an earlier one.
        self._remove(i, "rejected", now=True)
        self.stats.final_rejections += 1
        return FinalRejection(event_id, meta.kind, meta.run_id, Rejection(event_id, code, message, False))

    def take_local_rejections(self) -> list[FinalRejection]:
        """Events this outbox finally rejected itself (too large even when cut), for the caller to report."""
        out, self.local_rejections = self.local_rejections, []
        return out

    # -- receipts -----------------------------------------------------------------------------------
    def on_receipt(self, receipt: Receipt) -> list[FinalRejection]:
        """Apply a receipt, matched by event_id. Returns the final rejections for the caller to report."""
        finals: list[FinalRejection] = []
        index = self._index
        seqs = self._deliveries.answered(receipt.batch, receipt.accepted)
        tag, settled = receipt.batch & 0xFFFFFFFF, 0
        i = -1
        for event_id in receipt.accepted:
            # Receipts list a batch's events in order: the previous one's neighbour is checked first.
            if (i := self._find_sent(event_id, i + 1)) >= 0:
                settled += index.states[i] == IN_FLIGHT and index.batches[i] == tag
                self._remove(i, "accepted")
        for event_id, rej in {r.event_id: r for r in receipt.rejected}.items():
            if (i := self._find_sent(event_id)) < 0:
                continue
            if not rej.retryable:
                seq = index.seqs[i]
                meta = self._bodies.meta(seq)
                # Gone from disk before it is reported: a crash right after the report must not make
                # the next process resend it and report the same final rejection again (rare path).
                # Through the one writer (never on the event loop behind a commit): the report is a
                # later admission, so its commit is this deletion's or a later one.
                self._remove(i, "rejected", now=True)
                self.stats.final_rejections += 1
                finals.append(FinalRejection(event_id, meta.kind, meta.run_id, rej))
            elif index.states[i] == IN_FLIGHT:
                self._deliveries.retry_later(i)
        # Events of this batch in neither list were not stored: resend after a backoff (none, when the
        # receipt accepted the whole batch, the usual case: then the batch is not walked again).
        if settled < len(seqs):
            self._deliveries.unanswered(receipt.batch, seqs)
        self._sendable.set()
        index.compact()
        return finals

    def _find_sent(self, event_id: str, hint: int = -1) -> int:
        """The index of the pending event `event_id` names, or -1. Its seq is the id's last part, so
        no index by id is kept; the derived id must match exactly. An event not yet journaled was
        never sent, so a receipt naming it (a CP guessing ids) is ignored."""
        if (seq := EventIds.seq_of(event_id)) is None:
            return -1
        i = self._index.find(seq, hint)
        if i < 0 or self._index.states[i] == UNSYNCED or self._ids.of(seq) != event_id:
            return -1
        return i

    def _remove(self, i: int, outcome: str, *, now: bool = False, delete: bool = True) -> None:
        seq = self._index.seqs[i]
        self._index.remove(i)
        self._bodies.drop(seq)
        if self._terminals:
            self._terminals.pop(seq, None)
        if self._waiters.waiters:
            self._waiters.resolve(self._ids.of(seq), outcome)
        self._ids.forget(seq)
        # At once only for someone waiting for the outbox to be empty on disk; else with the next group
        # commit (outbox_writer.DELETE_FLUSH_S: a receipt costs no transaction of its own).
        if delete:
            self._writer.delete(seq, now=now or (bool(self._drain_waiters) and not self._index.live))
        if self._space_waiters and not self._full():
            self._space.set()

    def expire(self) -> float | None:
        """Time out unreceipted batches and release due retries. Returns seconds until the next due time."""
        released, wait = self._deliveries.expire()
        if released:
            self._sendable.set()
        return wait

    # -- link state ---------------------------------------------------------------------------------
    def on_link_up(self) -> None:
        self.link_up = True
        self._sendable.set()

    def on_link_down(self) -> None:
        """Everything in flight goes back to be resent after the next welcome, oldest first (the
        sender takes sendable events in seq order)."""
        self.link_up = False
        self._deliveries.reset()
        self.best_effort.drop_all()

    # -- waiting on outcomes ------------------------------------------------------------------------
    def watch(self, event_id: str) -> None:
        """Register interest in `event_id`'s receipt before it can possibly arrive."""
        self._waiters.watch(event_id)

    async def receipted(self, event_id: str) -> str:
        """Wait until `event_id` was accepted or finally rejected; returns "accepted" or "rejected"."""
        return await self._waiters.wait(event_id)

    def _check_drained(self) -> None:
        self._index.compact()  # after each group commit: no index is held across one
        if not self._index.live and not self._writer.busy:
            # Wake every waiter, and start a fresh event for the next time the outbox empties.
            self._drained.set()
            self._drained = anyio.Event()

    async def drained(self) -> None:
        """Wait until no lossless event is left without a receipt (and the deletions are journaled)."""
        self._drain_waiters += 1
        try:
            while self._index.live or self._writer.busy:
                if not self._index.live:
                    self._writer.flush_deletions()  # the last ones: now, not after DELETE_FLUSH_S
                await self._drained.wait()
        finally:
            self._drain_waiters -= 1

    # -- statistics ---------------------------------------------------------------------------------
    def snapshot(self) -> OutboxStats:
        s = self.stats
        index = self._index
        s.lossless_pending = index.live
        s.in_flight = self._deliveries.in_flight_count
        i = index.oldest()
        s.oldest_pending_seq = index.seqs[i] if i >= 0 else None
        # Admission times are kept in centiseconds: the age is exact to 10 ms.
        s.oldest_pending_age_ms = max(0, self._now_cs() - index.born[i]) * 10 if i >= 0 else None
        s.best_effort_dropped = self.best_effort.dropped
        s.best_effort_buffered = len(self.best_effort)
        return s

    def pending_terminal_of(self, run_id: str) -> str | None:
        """The event_id of `run_id`'s terminal while it is still unreceipted (restart recovery)."""
        for seq, terminal_run in self._terminals.items():
            if terminal_run == run_id:
                return self._ids.of(seq)
        return None

    def dropped_for_run(self, run_id: str) -> int:
        return self.best_effort.dropped_for(run_id)

    @property
    def pending_count(self) -> int:
        return self._index.live

    def describe(self) -> dict[str, Any]:
        return self.snapshot().describe()
