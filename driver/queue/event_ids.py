"""Event ids derived from (instance, epoch, seq) instead of stored: PROTOCOL §4 forms every id as
`{driver_instance_id}/{epoch}/{seq:06d}` (`event_id_for`), with the epoch of the process that admitted
the event. Seqs increase over the instance's life, so the epoch of a pending event is a step function
of its seq: a few (first seq, epoch) steps stand for any number of pending events, where one string
per event cost ~80 bytes. A journaled id that does not have that form (another instance id on the
same `state_dir`, a hand-edited journal) is kept verbatim: ids are never re-derived differently from
what the journal holds, so a resend always carries the stored id."""

from __future__ import annotations

from array import array
from bisect import bisect_right

from driver.protocol.events import event_id_for


class EventIds:
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._starts = array("q")  # first seq of each step, increasing
        self._epochs: list[int] = []  # the epoch from that seq on
        self._verbatim: dict[int, str] = {}  # seq → id, for ids not of the derived form
        # The newest step, where nearly every lookup lands (receipts of this process's events):
        # its first seq and its id prefix, so no bisection and no call per id.
        self._last_start = -1
        self._last_prefix = ""

    def add(self, seq: int, epoch: int) -> None:
        """Events from `seq` on (until a later step) were admitted by `epoch`. Seqs come increasing."""
        if self._epochs and self._epochs[-1] == epoch:
            return
        if self._starts and seq <= self._starts[-1]:
            raise ValueError(f"seq {seq} does not follow {self._starts[-1]}")
        self._starts.append(seq)
        self._epochs.append(epoch)
        self._last_start, self._last_prefix = seq, f"{self.instance_id}/{epoch}/"

    def recover(self, seq: int, event_id: str) -> None:
        """A journaled event of an earlier process, in seq order: learn its epoch from its id."""
        head, _, seq_part = event_id.rpartition("/")
        instance, _, epoch_part = head.rpartition("/")
        if instance == self.instance_id and _decimal(epoch_part) and _decimal(seq_part):
            epoch = int(epoch_part)
            if event_id_for(instance, epoch, seq) == event_id:
                self.add(seq, epoch)
                if self.of(seq) == event_id:
                    return
        self._verbatim[seq] = event_id

    def of(self, seq: int) -> str:
        """The event_id of the pending event `seq`."""
        if self._verbatim and (kept := self._verbatim.get(seq)) is not None:
            return kept
        if seq >= self._last_start >= 0:
            return f"{self._last_prefix}{seq:06d}"  # event_id_for's form, inlined for the hot path
        step = bisect_right(self._starts, seq) - 1
        if step < 0:
            raise KeyError(seq)
        return event_id_for(self.instance_id, self._epochs[step], seq)

    def forget(self, seq: int) -> None:
        """`seq` left the outbox (only verbatim ids take memory per event)."""
        if self._verbatim:
            self._verbatim.pop(seq, None)

    @staticmethod
    def seq_of(event_id: str) -> int | None:
        """The seq an id names (its last part); None when it names none. The caller checks that the
        pending event of that seq has exactly this id, so a foreign id never matches."""
        tail = event_id.rpartition("/")[2]
        return int(tail) if _decimal(tail) else None


def _decimal(text: str) -> bool:
    # ASCII only: str.isdigit() also accepts characters such as "²" that int() refuses.
    return text.isascii() and text.isdigit()
