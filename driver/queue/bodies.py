"""Where a pending lossless event's encoded body is: in memory (a bounded set of journaled bodies
about to be sent) or only in the journal, from which it is read back when sent. The per-event state
of the backlog stays compact (`pending`) because no body is held for it beyond this budget."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from driver.queue.journal import Journal

if TYPE_CHECKING:
    from driver.queue.outbox_writer import Writer


class EventMeta(msgspec.Struct):
    """What a final rejection reports of an event besides its id, read back from its body (kept per
    event only for run terminals; a final rejection is rare enough to decode one body)."""

    kind: str = ""
    run_id: str | None = None


_meta_decoder = msgspec.json.Decoder(EventMeta)


class Bodies:
    def __init__(self, journal: Journal, writer: Writer, cap: int) -> None:
        self.journal = journal
        self.writer = writer
        self.cap = cap
        # Seqs whose row failed its check when read back (the outbox sets them aside).
        self.tampered: set[int] = set()
        self._resident: dict[int, bytes] = {}  # seq → body of a journaled event kept in memory
        self.resident_bytes = 0

    def __len__(self) -> int:
        return len(self._resident)

    def keep(self, rows: list[tuple[int, str, str | None, str, bytes]]) -> None:
        """Keep the bodies of just-journaled rows in memory while the budget allows."""
        for row in rows:
            if self.resident_bytes + len(row[4]) > self.cap:
                return
            self._resident[row[0]] = row[4]
            self.resident_bytes += len(row[4])

    def get(self, seq: int) -> bytes | None:
        body = self._resident.get(seq)
        if body is not None:
            return body
        loaded, bad = self.journal.bodies([seq])
        self.tampered.update(bad)
        return loaded.get(seq)

    def get_many(self, seqs: list[int]) -> tuple[dict[int, bytes], set[int]]:
        """Bodies of `seqs` (one journal read for those not in memory), and the seqs whose row failed
        its MAC. A seq whose row is gone is in neither."""
        out = {seq: body for seq in seqs if (body := self._resident.get(seq)) is not None}
        bad: set[int] = set()
        if len(out) < len(seqs):
            loaded, failed = self.journal.bodies([seq for seq in seqs if seq not in out])
            out.update(loaded)
            bad.update(failed)
        return out, bad

    def replace(self, seq: int, body: bytes) -> None:
        """`body` is the event's bytes from now on (PROTOCOL §4.3's cut): kept in memory whatever the
        budget (a later read must not find the old bytes before the writer commits the cut) and
        journaled by the one writer."""
        self.writer.replace(seq, body)
        old = self._resident.get(seq)
        self.resident_bytes += len(body) - (len(old) if old is not None else 0)
        self._resident[seq] = body

    def drop(self, seq: int) -> None:
        if (body := self._resident.pop(seq, None)) is not None:
            self.resident_bytes -= len(body)

    def meta(self, seq: int) -> EventMeta:
        body = self.get(seq)
        try:
            return _meta_decoder.decode(body) if body is not None else EventMeta()
        except msgspec.DecodeError:
            return EventMeta()
