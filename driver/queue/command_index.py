"""An in-memory mirror of the journal's `commands` table.

The kernel looks commands up on the event loop (`on_command`, `hello`); reading SQLite there would
wait on the journal's lock while a group commit fsyncs. The journal updates this mirror after each of
its own commits, so every read is a dict lookup. No I/O here.
"""

from __future__ import annotations

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
    def __init__(self, pruned_through: int = 0) -> None:
        self._by_id: dict[str, StoredCommand] = {}
        self._touched: dict[str, int] = {}
        self._by_seq: dict[int, set[str]] = {}
        self.pruned_through = pruned_through

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

    def prune(self, touched_through: int, seq_through: int) -> int | None:
        """Drop terminal commands touched at or before `touched_through` with seq at or below
        `seq_through` (the journal's DELETE); return the highest seq dropped."""
        gone = [
            c
            for c in self._by_id.values()
            if self._touched[c.command_id] <= touched_through and c.seq <= seq_through and c.status in TERMINAL
        ]
        for c in gone:
            del self._by_id[c.command_id]
            del self._touched[c.command_id]
            ids = self._by_seq[c.seq]
            ids.discard(c.command_id)
            if not ids:
                del self._by_seq[c.seq]
        return max((c.seq for c in gone), default=None)

    def last_terminal_seq(self) -> int:
        """The highest seq such that every command up to it is terminal; a gap stops the scan.

        A seq shared by two command ids (a CP bug) ends the scan after it, as the journal's ordered
        scan does.
        """
        last = self.pruned_through
        while True:
            ids = self._by_seq.get(last + 1)
            if not ids or any(self._by_id[c].status not in TERMINAL for c in ids):
                return last
            last += 1
            if len(ids) > 1:
                return last
