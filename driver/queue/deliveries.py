"""Delivery attempts of the outbox's lossless events: which batches are in flight and since when,
which events wait for a retry and until when (capped exponential backoff), and what a link drop puts
back. Per-event state (state, attempts, batch) lives in the `PendingIndex` arrays; this keeps only
the batches and timers, whose size follows what was sent, never the backlog."""

from __future__ import annotations

import heapq
from collections.abc import Callable

from driver.queue.best_effort import BestEffortBuffer, BestEffortEvent
from driver.queue.outbox_types import OutboxStats, RetryPolicy
from driver.queue.pending import IN_FLIGHT, WAITING, PendingIndex

# Batch numbers are stored per event in 32 bits and only compared for equality: an event would have to
# stay in flight across 2**32 batches for two numbers to be confused.
_TAG = 0xFFFFFFFF


class Deliveries:
    def __init__(
        self,
        index: PendingIndex,
        retry: RetryPolicy,
        clock: Callable[[], float],
        best_effort: BestEffortBuffer,
        stats: OutboxStats,
    ) -> None:
        self._index = index
        self._retry = retry
        self._clock = clock
        self._best_effort = best_effort
        self._stats = stats
        self._batch_no = 0
        # batch number → (receipt deadline, lossless seqs, best-effort events)
        self._in_flight: dict[int, tuple[float, list[int], list[BestEffortEvent]]] = {}
        self._waiting: list[tuple[float, int]] = []  # heap of (ready_at, seq)

    @property
    def in_flight_count(self) -> int:
        return sum(len(seqs) for _, seqs, _ in self._in_flight.values())

    def start(self, picked: list[int], best_effort: list[BestEffortEvent]) -> tuple[int, list[int]]:
        """Send the events at `picked` (indices) and `best_effort` as the next batch: (number, seqs)."""
        index = self._index
        self._batch_no += 1
        tag = self._batch_no & _TAG
        attempts = index.attempts
        for i in picked:
            if attempts[i]:
                self._stats.retries += 1
            attempts[i] = min(255, attempts[i] + 1)  # the backoff is capped long before 255
            index.states[i] = IN_FLIGHT
            index.batches[i] = tag
        seqs = [index.seqs[i] for i in picked]
        self._in_flight[self._batch_no] = (self._clock() + self._retry.receipt_timeout, seqs, best_effort)
        return self._batch_no, seqs

    def answered(self, number: int, accepted: list[str]) -> list[int]:
        """Batch `number` got its receipt: count its best-effort events that were not accepted as
        dropped; return its lossless seqs (empty for an unknown or already expired batch)."""
        flight = self._in_flight.pop(number, None)
        if flight is None:
            return []
        if flight[2]:
            stored = set(accepted)
            for b in flight[2]:
                if b.event_id not in stored:
                    self._best_effort.count_drop(b.run_id, b.pieces)
        return flight[1]

    def unanswered(self, number: int, seqs: list[int]) -> None:
        """Events of batch `number` still in flight in that batch were not stored: retry them."""
        index = self._index
        tag = number & _TAG
        i = -1
        for seq in seqs:
            i = index.find(seq, i + 1)
            if i >= 0 and index.states[i] == IN_FLIGHT and index.batches[i] == tag:
                self.retry_later(i)

    def retry_later(self, i: int) -> None:
        self._index.states[i] = WAITING
        due = self._clock() + self._retry.delay(self._index.attempts[i])
        heapq.heappush(self._waiting, (due, self._index.seqs[i]))

    def expire(self) -> tuple[bool, float | None]:
        """Time out unreceipted batches and release due retries: (any released, seconds until the
        next due time or None)."""
        index = self._index
        now = self._clock()
        for number, (deadline, seqs, be) in list(self._in_flight.items()):
            if deadline <= now:
                del self._in_flight[number]
                for b in be:
                    self._best_effort.count_drop(b.run_id, b.pieces)
                self.unanswered(number, seqs)
        released = False
        while self._waiting and self._waiting[0][0] <= now:
            _, seq = heapq.heappop(self._waiting)
            i = index.find(seq)
            if i >= 0 and index.states[i] == WAITING:
                index.set_ready(i)
                released = True
        nexts = [d for d, _, _ in self._in_flight.values()]
        if self._waiting:
            nexts.append(self._waiting[0][0])
        return released, (max(0.0, min(nexts) - now) if nexts else None)

    def reset(self) -> None:
        """The link dropped: every batch is unanswered, its best-effort events dropped, and every event
        in flight or waiting is sendable again as if never sent. Only what was sent is walked: every
        such event is in a batch's list or in the retry heap, so the backlog's size does not matter."""
        index = self._index
        sent: list[int] = []
        for _, seqs, be in self._in_flight.values():
            for b in be:
                self._best_effort.count_drop(b.run_id, b.pieces)
            sent.extend(seqs)
        self._in_flight.clear()
        sent.extend(seq for _, seq in self._waiting)
        self._waiting.clear()
        for seq in sent:
            i = index.find(seq)
            if i >= 0 and index.states[i] in (IN_FLIGHT, WAITING):
                index.set_ready(i)
                index.attempts[i] = 0
