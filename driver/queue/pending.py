"""The outbox's pending lossless events as parallel arrays in seq order: ~22 bytes an event.

One Python object per pending event (a dataclass with its id, run id, kind, times and a heap entry)
cost ~345 bytes, so a link-down backlog of 100,000 events took ~33 MB and a million could not fit the
issue-10 goals (≤ 16 MB and ≤ 64 MB). Here an event is its seq (8 bytes), size (4), admission time
(4), batch number (4), state (1) and attempts (1), each in a typed array; everything else is derived
(the event_id, see `event_ids`) or read back from the journal on the rare paths that need it.

Events are appended in seq order (admission stamps seqs in order and appends at once), so a seq is
found by bisection. A removed event is marked GONE in place; `compact()` reclaims the gaps, and is
called only where no index is held (indices shift). Sendable events are found with `bytearray.find`
over the states from a cursor below which nothing is READY: memchr speed, no heap of seqs.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from itertools import compress

# States, one byte each. UNSYNCED: admitted, not yet journaled (never sent). READY: sendable.
UNSYNCED, READY, IN_FLIGHT, WAITING, GONE = 0, 1, 2, 3, 4
_READY = bytes([READY])
# Compaction keeps everything but GONE (a mask of 1 for kept entries, for itertools.compress).
_KEEP = bytes(0 if b == GONE else 1 for b in range(256))
_U32 = 0xFFFFFFFF


class PendingIndex:
    compact_min = 4096  # below this many entries, gaps are not worth a rebuild (tests lower it)

    def __init__(self) -> None:
        self._clear()

    def _clear(self) -> None:
        self.seqs = array("q")
        self.sizes = array("I")  # encoded bytes; an event is at most a frame (4 MiB) or a journal blob
        self.born = array("I")  # admission time, centiseconds since the outbox began (held at 497 days)
        self.batches = array("I")  # the batch an IN_FLIGHT event went out in, modulo 2**32
        self.states = bytearray()
        self.attempts = bytearray()  # sends so far, capped at 255 (the backoff is capped long before)
        self.live = 0
        self.bytes = 0
        self._head = 0  # no live entry below this index
        self._cursor = 0  # no READY entry below this index

    def __len__(self) -> int:
        return self.live

    # -- adding and finding ---------------------------------------------------------------------------
    def add(self, seq: int, size: int, state: int, born_cs: int) -> None:
        if self.seqs and seq <= self.seqs[-1]:
            raise ValueError(f"seq {seq} does not follow {self.seqs[-1]}")
        self.seqs.append(seq)
        self.sizes.append(size)
        self.born.append(min(max(0, born_cs), _U32))
        self.batches.append(0)
        self.states.append(state)
        self.attempts.append(0)
        self.live += 1
        self.bytes += size
        if state == READY:
            self._cursor = min(self._cursor, len(self.states) - 1)

    def find(self, seq: int, hint: int = -1) -> int:
        """The index of the live event `seq`, or -1. `hint`: a likely index, checked first."""
        seqs = self.seqs
        if not (0 <= hint < len(seqs) and seqs[hint] == seq):
            hint = bisect_left(seqs, seq, self._head)
            if hint >= len(seqs) or seqs[hint] != seq:
                return -1
        return hint if self.states[hint] != GONE else -1

    def next_ready(self, start: int = -1) -> int:
        """The first READY index at or after `start` (default: the cursor), or -1."""
        i = self.states.find(_READY, max(start, self._cursor))
        if start < 0:
            # Nothing READY below i (or anywhere, for -1): later scans start there.
            self._cursor = i if i >= 0 else len(self.states)
        return i

    def oldest(self) -> int:
        """The index of the oldest live event (journaled or not), or -1."""
        return self._head if self._head < len(self.states) else -1

    def oldest_journaled(self) -> int:
        """The index of the oldest live event that is journaled (not UNSYNCED), or -1. Group commits
        go in seq order, so the unjournaled events are the newest: if the oldest is one, all are."""
        i = self.oldest()
        return i if i >= 0 and self.states[i] != UNSYNCED else -1

    # -- changing -------------------------------------------------------------------------------------
    def set_ready(self, i: int) -> None:
        self.states[i] = READY
        if i < self._cursor:
            self._cursor = i

    def set_ready_range(self, start: int, stop: int) -> None:
        """Mark [start, stop) READY (a group commit's events: contiguous, all UNSYNCED)."""
        self.states[start:stop] = _READY * (stop - start)
        if start < self._cursor:
            self._cursor = start

    def resize(self, i: int, size: int) -> None:
        self.bytes += size - self.sizes[i]
        self.sizes[i] = size

    def remove(self, i: int) -> int:
        """Mark event `i` gone; return its size. Indices stay valid until `compact()`."""
        size = self.sizes[i]
        self.states[i] = GONE
        self.live -= 1
        self.bytes -= size
        if i == self._head:
            states, n = self.states, len(self.states)
            while i < n and states[i] == GONE:
                i += 1
            self._head = i
        return size

    def compact(self) -> None:
        """Reclaim removed entries once they are at least half of the arrays. Shifts indices: call it
        only where no index is held. Amortised O(1) per removal: a rebuild of n entries follows at
        least n/2 removals."""
        n = len(self.states)
        if self.live == 0:
            if n:
                self._clear()
            return
        if n < self.compact_min or (n - self.live) * 2 < n:
            return
        if self.live == n - self._head:
            # The gaps are all at the front (receipts in order, the usual case): one memmove each.
            cut = self._head
            for column in (self.seqs, self.sizes, self.born, self.batches, self.states, self.attempts):
                del column[:cut]
            self._cursor = max(0, self._cursor - cut)
        else:
            keep = self.states.translate(_KEEP)
            self.seqs = array("q", compress(self.seqs, keep))
            self.sizes = array("I", compress(self.sizes, keep))
            self.born = array("I", compress(self.born, keep))
            self.batches = array("I", compress(self.batches, keep))
            self.states = bytearray(compress(self.states, keep))
            self.attempts = bytearray(compress(self.attempts, keep))
            self._cursor = 0  # a rescan from the front finds the first READY again
        self._head = 0
