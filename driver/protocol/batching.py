"""How large a batch frame the link may send (PROTOCOL §4.3), without I/O.

A batch is never larger than the welcome's `max_batch_bytes` (nor the 4 MiB frame limit). When the
control plane closes the link with 1009 (message too big) anyway, the driver halves its batch size
for that link (this `Link` object: every later connection to the same CP) from the largest frame it
sent on the refused connection, so the refused frame is never sent again: its events go out in
smaller frames, and an event larger than the new size is cut to fit by the outbox. At the floor a
further 1009 means the oldest event cannot be delivered at all: it is finally rejected.
"""

from __future__ import annotations

import msgspec

MIN_BATCH_BYTES = 4096
FRAME_ALLOWANCE = 1024  # the frame's own envelope, under the hard frame limit


class BatchLimit(msgspec.Struct):
    hard_limit: int
    cap: int | None = None  # set by 1009s, for the life of the link
    largest_sent: int = 0  # on the current connection

    def limit(self, max_batch_bytes: int) -> int:
        """The batch size for a connection whose welcome said `max_batch_bytes`."""
        limit = min(max_batch_bytes, self.hard_limit - FRAME_ALLOWANCE)
        if self.cap is not None:
            limit = min(limit, self.cap)
        return max(MIN_BATCH_BYTES, limit)

    def connected(self) -> None:
        self.largest_sent = 0

    def sent(self, size: int) -> None:
        self.largest_sent = max(self.largest_sent, size)

    def refused(self) -> bool:
        """The CP closed with 1009. Halve; True when already at the floor (nothing left to halve)."""
        if self.largest_sent <= MIN_BATCH_BYTES and self.cap == MIN_BATCH_BYTES:
            return True
        base = self.largest_sent or self.cap or self.hard_limit
        self.cap = max(MIN_BATCH_BYTES, min(base, self.cap or base) // 2)
        return False
