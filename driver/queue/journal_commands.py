"""The journal's command statuses (PROTOCOL §3): the `commands` table, its in-memory mirror, pruning
and `last_command_seq`. A mixin of `Journal` (same connection, lock and MAC), apart so each module
keeps one job. Statuses are written inside `Journal.commit` (the one writer's transaction); the mirror
changes only after that commit."""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING

import msgspec

from driver.queue.command_index import TERMINAL, CommandIndex, StoredCommand
from driver.queue.schema import COMMANDS_KEPT, PRUNED_RANGES_KEPT

if TYPE_CHECKING:
    from driver.queue.rowmac import RowMac

PRUNED_RANGES_KEY = "commands.pruned_ranges"


class JournalCommands:
    _db: sqlite3.Connection
    _lock: threading.Lock
    _counter: int
    _commands: CommandIndex
    mac: RowMac

    if TYPE_CHECKING:

        def _set_aside(
            self, table: str, key: object, reason: str, values: tuple[object, ...], *, report: bool = True
        ) -> None: ...
        def _text_checked(self, key: str) -> str | None: ...
        def _set_meta(self, key: str, value: int) -> None: ...
        def _set_text_row(self, key: str, value: str) -> None: ...

    # -- commands -----------------------------------------------------------------------------------
    def _max_touched(self) -> int:
        top = self._db.execute("SELECT MAX(touched) FROM commands").fetchone()[0]
        return top if isinstance(top, int) else 0

    def _pruned_ranges(self) -> list[tuple[int, int]]:
        raw = self._text_checked(PRUNED_RANGES_KEY)
        try:
            ranges = msgspec.json.decode(raw, type=list[tuple[int, int]]) if raw else []
        except msgspec.DecodeError:
            ranges = []
        return [(lo, hi) for lo, hi in ranges if lo <= hi]

    def _load_commands(self) -> None:
        for row in self._db.execute(
            "SELECT command_id, seq, fingerprint, status, update_frame, kind, touched, mac FROM commands "
            "ORDER BY touched"
        ).fetchall():
            command_id, seq, fingerprint, status, frame, kind, touched, mac = row
            if not self.mac.check(mac, "commands", command_id, seq, fingerprint, status, frame, kind):
                self._set_aside("commands", command_id, "mac", tuple(row[:6]))
                self._db.execute("DELETE FROM commands WHERE command_id = ?", (command_id,))
                continue
            self._commands.put(StoredCommand(command_id, seq, fingerprint, status, frame, kind), int(touched))

    def command(self, command_id: str) -> StoredCommand | None:
        """From memory: safe on the event loop while a commit holds the connection."""
        return self._commands.get(command_id)

    def command_kind(self, command_id: str) -> str | None:
        stored = self.command(command_id)
        return stored.kind if stored is not None else None

    def _save_statuses(self, commands: list[StoredCommand]) -> tuple[int, list[int]] | None:
        """Upsert statuses (inside `commit`'s transaction); prune every 256 saves. Returns the prune's
        (touched_through, seqs) for the mirror, or None."""
        first = self._counter + 1
        for touched, c in enumerate(commands, start=first):
            # The row keeps the first seq, fingerprint and (unless named anew) kind, as the mirror does.
            old = self._commands.get(c.command_id)
            seq, fp, kind = (old.seq, old.fingerprint, c.kind or old.kind) if old else (c.seq, c.fingerprint, c.kind)
            mac = self.mac.of("commands", c.command_id, seq, fp, c.status, c.update_frame, kind)
            self._db.execute(
                "INSERT INTO commands(command_id, seq, fingerprint, status, update_frame, touched, kind, mac) "
                "VALUES(?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(command_id) DO UPDATE SET "
                "seq = excluded.seq, fingerprint = excluded.fingerprint, status = excluded.status, "
                "update_frame = excluded.update_frame, touched = excluded.touched, kind = excluded.kind, "
                "mac = excluded.mac",
                (c.command_id, seq, fp, c.status, c.update_frame, touched, kind, mac),
            )
        last = first + len(commands) - 1
        self._set_meta("touch_counter", last)
        if last // 256 <= (first - 1) // 256:
            return None
        # By age alone: a seq the CP never sent (a gap) must not stop pruning (issue 19). What is pruned
        # above the contiguous terminal prefix is remembered as ranges, so `last_command_seq` knows a
        # missing row was pruned, not never seen (claiming a never-seen command would stop the CP from
        # resending it).
        through = last - COMMANDS_KEPT
        statuses = ",".join(f"'{s}'" for s in sorted(TERMINAL))
        where = f"touched <= ? AND status IN ({statuses})"
        seqs = [int(r[0]) for r in self._db.execute(f"SELECT seq FROM commands WHERE {where}", (through,))]
        # Saved in this batch but not in the mirror yet: their seqs are in `seqs` through the table.
        if not seqs:
            return None
        self._db.execute(f"DELETE FROM commands WHERE {where}", (through,))
        probe = CommandIndex(self._commands.pruned_through, list(self._commands.pruned_ranges))
        probe.add_pruned(seqs, PRUNED_RANGES_KEPT)
        self._set_meta("commands_pruned_through", probe.pruned_through)
        self._set_text_row(PRUNED_RANGES_KEY, msgspec.json.encode(probe.pruned_ranges).decode())
        return through, seqs

    def _mirror(self, commands: list[StoredCommand], pruned: tuple[int, list[int]] | None) -> None:
        """After the commit (under the same lock, so the mirror follows the database's order)."""
        for touched, c in enumerate(commands, start=self._counter + 1):
            self._commands.put(c, touched)
        self._counter += len(commands)
        if pruned is not None:
            # The commands just saved may be pruned too, so the mirror prunes after the puts.
            self._commands.prune(pruned[0])
            self._commands.add_pruned(pruned[1], PRUNED_RANGES_KEPT)

    def last_command_seq(self) -> int:
        """The highest seq such that every command up to it has a terminal status (0 for none).

        Commands are numbered from 1 by the CP; a gap (a seq never seen) stops the scan, because the
        CP must resend that command. Pruned seqs are stepped over (`CommandIndex`). From memory, like
        `command()`; the mirror changes only after a commit, so a counted command's status and its
        `command.finished` are durable.
        """
        return self._commands.last_terminal_seq()

    def open_commands(self) -> list[StoredCommand]:
        """Commands accepted by an earlier process that never reached a terminal status (from memory:
        only rows that passed their check)."""
        with self._lock:
            return [
                StoredCommand(c.command_id, c.seq, c.fingerprint, c.status, None, c.kind)
                for c in self._commands.open_commands()
            ]
