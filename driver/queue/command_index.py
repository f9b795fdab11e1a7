"""An in-memory mirror of the journal's `commands` table.

The kernel looks commands up on the event loop (`on_command`, `hello`); reading SQLite there would
wait on the journal's lock while a group commit fsyncs. The journal updates this mirror after each of
its own commits, so every read is a dict lookup. No I/O here.
"""

from __future__ import annotations

from bisect import insort

import msgspec

TERMINAL = frozenset({"completed", "failed", "cancelled"})


class StoredCommand(msgspec.Struct, frozen=True):
    command_id: str
    seq: int
    fingerprint: str
    status: str
    update_frame: bytes | None
    kind: str | None = None


class CommandIndex:
    def __init__(self, pruned_through: int = 0, pruned_ranges: list[tuple[int, int]] | None = None) -> None:
        self._by_id: dict[str, StoredCommand] = {}
        self._touched: dict[str, int] = {}
        self._by_seq: dict[int, set[str]] = {}
        self.pruned_through = pruned_through
        # Terminal commands pruned ABOVE a gap (a seq never seen): (first, last) seq ranges, sorted and
        # disjoint. Pruning goes by age alone, so a missing seq cannot make the table grow for ever;
        # these ranges let `last_terminal_seq` step over what was pruned once the gap is filled.
        self.pruned_ranges: list[tuple[int, int]] = sorted(pruned_ranges or [])

    def open_commands(self) -> list[StoredCommand]:
        """Commands without a terminal status, by seq."""
        return sorted((c for c in self._by_id.values() if c.status not in TERMINAL), key=lambda c: c.seq)

    def max_touched(self) -> int:
        return max(self._touched.values(), default=0)

    def add_pruned(self, seqs: list[int], keep: int) -> None:
        """Remember pruned seqs: the contiguous ones join `pruned_through`, the rest become ranges."""
        for seq in sorted(set(seqs)):
            if seq <= self.pruned_through:
                continue
            insort(self.pruned_ranges, (seq, seq))
        merged: list[tuple[int, int]] = []
        for lo, hi in self.pruned_ranges:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        while merged and merged[0][0] <= self.pruned_through + 1:
            self.pruned_through = max(self.pruned_through, merged.pop(0)[1])
        self.pruned_ranges = merged[:keep]

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, command_id: str) -> StoredCommand | None:
        return self._by_id.get(command_id)

    def put(self, stored: StoredCommand, touched: int) -> None:
        """Insert or update, as the journal's upsert does: a repeat keeps the first seq, fingerprint
        and (unless the new one names it) kind."""
        old = self._by_id.get(stored.command_id)
        if old is not None:
            stored = StoredCommand(
                old.command_id, old.seq, old.fingerprint, stored.status, stored.update_frame, stored.kind or old.kind
            )
        self._by_id[stored.command_id] = stored
        self._touched[stored.command_id] = touched
        self._by_seq.setdefault(stored.seq, set()).add(stored.command_id)

    def prune(self, touched_through: int) -> list[int]:
        """Drop terminal commands touched at or before `touched_through` (the journal's DELETE);
        return the seqs dropped."""
        gone = [
            c for c in self._by_id.values() if self._touched[c.command_id] <= touched_through and c.status in TERMINAL
        ]
        for c in gone:
            del self._by_id[c.command_id]
            del self._touched[c.command_id]
            ids = self._by_seq[c.seq]
            ids.discard(c.command_id)
            if not ids:
                del self._by_seq[c.seq]
        return [c.seq for c in gone]

    def remove(self, command_id: str) -> None:
        """Forget a command whose row failed its check (never acted on)."""
        c = self._by_id.pop(command_id, None)
        if c is not None:
            del self._touched[command_id]
            ids = self._by_seq.get(c.seq, set())
            ids.discard(command_id)
            if not ids:
                self._by_seq.pop(c.seq, None)

    def last_terminal_seq(self) -> int:
        """The highest seq such that every command up to it is terminal; a gap stops the scan.

        A seq shared by two command ids (a CP bug) ends the scan after it, as the journal's ordered
        scan does.
        """
        last = self.pruned_through
        ranges, r = self.pruned_ranges, 0
        while True:
            while r < len(ranges) and ranges[r][1] <= last:
                r += 1
            if r < len(ranges) and ranges[r][0] == last + 1:
                last = ranges[r][1]
                continue
            ids = self._by_seq.get(last + 1)
            if not ids or any(self._by_id[c].status not in TERMINAL for c in ids):
                return last
            last += 1
            if len(ids) > 1:
                return last
