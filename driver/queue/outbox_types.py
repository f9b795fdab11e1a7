"""The outbox's records without behaviour: a batch, a final rejection, the statistics, the retry
policy, and the event timestamp (`utc_now`). The outbox itself is `outbox`; the per-event state of
pending events is `pending`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import msgspec

from driver.protocol.frames import Rejection
from driver.queue.best_effort import BestEffortEvent

_second_cache: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """ISO 8601 UTC with milliseconds, e.g. 2026-11-29T10:00:01.250Z.

    Called for every event: the date-and-time part is formatted once per second and reused, which
    makes this several times cheaper than datetime.isoformat on the hot path."""
    global _second_cache
    now = time.time()
    second = int(now)
    if _second_cache[0] != second:
        _second_cache = (second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{_second_cache[1]}.{int((now - second) * 1000):03d}Z"


class Batch(msgspec.Struct, frozen=True):
    number: int
    frame_events: list[bytes]
    lossless_seqs: list[int]
    best_effort: list[BestEffortEvent]


class FinalRejection(msgspec.Struct, frozen=True):
    event_id: str
    kind: str
    run_id: str | None
    rejection: Rejection


class OutboxStats(msgspec.Struct):
    lossless_pending: int = 0
    in_flight: int = 0
    oldest_pending_seq: int | None = None
    oldest_pending_age_ms: int | None = None
    retries: int = 0
    best_effort_dropped: int = 0
    best_effort_buffered: int = 0
    final_rejections: int = 0

    def describe(self) -> dict[str, Any]:
        """The figures the link logs at every change of the link."""
        return {
            "lossless_pending": self.lossless_pending,
            "in_flight": self.in_flight,
            "oldest_pending_seq": self.oldest_pending_seq,
            "oldest_pending_age_ms": self.oldest_pending_age_ms,
            "retries": self.retries,
            "best_effort_dropped": self.best_effort_dropped,
            "final_rejections": self.final_rejections,
        }


class RetryPolicy(msgspec.Struct):
    """Capped exponential backoff for unreceipted lossless events (injectable for tests)."""

    receipt_timeout: float = 10.0
    base: float = 0.25
    cap: float = 30.0

    def delay(self, attempts: int) -> float:
        from driver.protocol.backoff import delay, exponential

        return delay(exponential(base=self.base, cap=self.cap), attempts)  # tenacity's policy
