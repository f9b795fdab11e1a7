"""The driver's durable state under `state_dir`: one SQLite database in WAL mode.

It holds the lossless outbox (each event's full encoded bytes, keyed by `seq` and unique `event_id`),
the epoch and the seq reservation, command terminal statuses (so idempotency survives a restart), and
the run that is active (so the next process can end it `driver.restarted`).

This module is synchronous and small on purpose; `driver.queue.outbox` calls it from a worker thread
for the hot path (group commits) and directly for rare writes. A lock serialises access because the
connection is shared between that thread and the event loop.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import msgspec

from driver.queue.command_index import CommandIndex, StoredCommand
from driver.queue.schema import (
    COMMANDS_KEPT,
    DERIVED_KINDS,
    MIGRATIONS,
    RUN_TERMINAL_KINDS,
    RUNS_KEPT,
    SCHEMA,
    SEQ_BLOCK,
    TRANSCRIPT_MAX_BYTES,
    terminal_error,
)


class JournaledEvent(NamedTuple):
    """One outbox row, in column order (a tuple, so a group commit hands rows to SQLite as they are)."""

    seq: int
    event_id: str
    run_id: str | None
    kind: str
    body: bytes


class EndedRun(msgspec.Struct, frozen=True):
    """A run whose terminal was journaled: its kind and, for `run.failed`, the error payload."""

    run_id: str
    command_id: str
    terminal: str
    error: dict[str, object] | None


class Journal:
    def __init__(self, path: Path, *, synchronous: str = "FULL") -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self._lock = threading.Lock()
        # Create the file private before SQLite opens it: SQLite gives the -wal and -shm files (which hold
        # the same event payloads) the database file's mode, so a later chmod alone would leave them 0644.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600))
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: every commit fsyncs the WAL, so a receipt-less event survives power loss, not just a crash.
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(SCHEMA)
        self._migrate()
        self._counter = self._meta("touch_counter", 0)
        # Commands are read on the event loop: from this mirror, never from SQLite (see command_index).
        self._commands = CommandIndex(self._meta("commands_pruned_through", 0))
        for row in self._db.execute(
            "SELECT command_id, seq, fingerprint, status, update_frame, kind, touched FROM commands ORDER BY touched"
        ):
            frame = bytes(row[4]) if row[4] is not None else None
            self._commands.put(StoredCommand(row[0], int(row[1]), row[2], row[3], frame, row[5]), int(row[6]))
        # A second connection for reading event bodies back: in WAL mode it reads committed rows while
        # the writer's commit (and its fsync) is in progress, so a sender re-reading a backlog is never
        # stuck behind a group commit.
        self._reader_lock = threading.Lock()
        self._reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for private in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if private.exists():  # files left by an older process may predate the rule above
                private.chmod(0o600)

    def close(self) -> None:
        with self._lock, self._reader_lock:
            self._reader.close()
            self._db.close()

    def _migrate(self) -> None:
        for table, column, decl in MIGRATIONS:
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in have:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")

    # -- meta ---------------------------------------------------------------------------------------
    def _meta(self, key: str, default: int) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else default

    def _set_meta(self, key: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def bump_epoch(self) -> int:
        """Increment and return the epoch: 1 for the first process of this state_dir."""
        with self._lock, self._tx():
            epoch = self._meta("epoch", 0) + 1
            self._set_meta("epoch", epoch)
            return epoch

    def reserve_seqs(self) -> tuple[int, int]:
        """Reserve the next block of seqs; return (first, end) with end exclusive."""
        with self._lock, self._tx():
            start = self._meta("seq_reserved", 0) + 1
            top = self._db.execute("SELECT MAX(seq) FROM outbox").fetchone()[0]
            if top is not None:
                start = max(start, int(top) + 1)
            end = start + SEQ_BLOCK
            self._set_meta("seq_reserved", end - 1)
            return start, end

    # -- outbox -------------------------------------------------------------------------------------
    def append(self, events: Iterable[JournaledEvent]) -> None:
        """Write events in one transaction (one fsync: the group commit)."""
        self.commit(events, ())

    def delete(self, seqs: Iterable[int]) -> None:
        self.commit((), seqs)

    def commit(
        self,
        events: Iterable[tuple[int, str, str | None, str, bytes]],
        deleted: Iterable[int],
        reserve_through: int = 0,
    ) -> None:
        """Append new events, delete receipted ones and extend the seq reservation to
        `reserve_through`, in ONE transaction: one fsync for all three, which is what keeps the journal
        off the event path's critical time at high rates."""
        rows = list(events)
        gone = [(s,) for s in deleted]
        if not rows and not gone and not reserve_through:
            return
        with self._lock, self._tx():
            if reserve_through > self._meta("seq_reserved", 0):
                self._set_meta("seq_reserved", reserve_through)
            if rows:
                self._db.executemany(
                    "INSERT OR IGNORE INTO outbox(seq, event_id, run_id, kind, body) VALUES(?, ?, ?, ?, ?)", rows
                )
                # A run stops being active in the same transaction that makes its terminal durable, so
                # a restart can never see an active run whose terminal is already on its way; the
                # terminal is remembered so the run's command status can mirror it after a restart.
                ended = [
                    (kind, terminal_error(body), run_id)
                    for _, _, run_id, kind, body in rows
                    if kind in RUN_TERMINAL_KINDS and run_id
                ]
                if ended:
                    self._db.executemany("UPDATE runs SET terminal = ?, error = ? WHERE run_id = ?", ended)
                derived: dict[str, int] = {}
                for _, _, run_id, kind, _ in rows:
                    if run_id and kind in DERIVED_KINDS:
                        derived[run_id] = derived.get(run_id, 0) + 1
                if derived:
                    self._db.executemany(
                        "UPDATE runs SET derived = derived + ? WHERE run_id = ?", [(n, r) for r, n in derived.items()]
                    )
            if gone:
                self._db.executemany("DELETE FROM outbox WHERE seq = ?", gone)

    def replace_body(self, seq: int, body: bytes) -> None:
        """Store the cut form of an oversize journaled event (PROTOCOL §4.3), so every later send,
        by this process or the next, carries the same bytes under the same event_id."""
        with self._lock, self._tx():
            self._db.execute("UPDATE outbox SET body = ? WHERE seq = ?", (body, seq))

    def bodies(self, seqs: list[int]) -> dict[int, bytes]:
        """Bodies of committed events (only committed ones are ever evicted from memory)."""
        with self._reader_lock:
            out: dict[int, bytes] = {}
            for i in range(0, len(seqs), 500):
                chunk = seqs[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for seq, body in self._reader.execute(f"SELECT seq, body FROM outbox WHERE seq IN ({marks})", chunk):
                    out[int(seq)] = bytes(body)
            return out

    def pending(self) -> Iterator[tuple[int, str, str | None, str, int]]:
        """(seq, event_id, run_id, kind, size) of every journaled event, oldest first, without bodies.

        In chunks by seq: all rows at once peaked at ~300 MB for a million pending events, where the
        outbox keeps ~22 bytes of each."""
        after = -1
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT seq, event_id, run_id, kind, length(body) FROM outbox "
                    "WHERE seq > ? ORDER BY seq LIMIT 8192",
                    (after,),
                ).fetchall()
            for seq, event_id, run_id, kind, size in rows:
                yield int(seq), str(event_id), run_id, str(kind), int(size)
            if len(rows) < 8192:
                return
            after = int(rows[-1][0])

    def has_terminal(self, run_id: str) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM outbox WHERE run_id = ? AND kind IN ('run.completed','run.failed','run.cancelled')",
                (run_id,),
            ).fetchone()
        return row is not None

    # -- commands -----------------------------------------------------------------------------------
    def command(self, command_id: str) -> StoredCommand | None:
        """From memory: safe on the event loop while a commit holds the connection."""
        return self._commands.get(command_id)

    def command_kind(self, command_id: str) -> str | None:
        stored = self.command(command_id)
        return stored.kind if stored is not None else None

    def save_command(
        self,
        command_id: str,
        seq: int,
        fingerprint: str,
        status: str,
        update_frame: bytes | None,
        kind: str | None = None,
    ) -> None:
        self.save_commands([StoredCommand(command_id, seq, fingerprint, status, update_frame, kind)])

    def save_commands(self, commands: list[StoredCommand]) -> None:
        """Save statuses in ONE transaction (one fsync: the group commit of `CommandSaver`)."""
        if not commands:
            return
        with self._lock:
            first = self._counter + 1
            with self._tx():
                for c in commands:
                    self._counter += 1
                    self._db.execute(
                        "INSERT INTO commands(command_id, seq, fingerprint, status, update_frame, touched, kind) "
                        "VALUES(?, ?, ?, ?, ?, ?, ?) ON CONFLICT(command_id) DO UPDATE SET "
                        "status = excluded.status, update_frame = excluded.update_frame, "
                        "touched = excluded.touched, kind = coalesce(excluded.kind, commands.kind)",
                        (c.command_id, c.seq, c.fingerprint, c.status, c.update_frame, self._counter, c.kind),
                    )
                self._set_meta("touch_counter", self._counter)
                # Every 256 saves (once per batch that crosses a multiple of 256).
                prune = self._counter // 256 > (first - 1) // 256
                if prune:
                    # Only rows inside the contiguous terminal prefix are pruned, and the highest pruned
                    # seq is remembered: `last_command_seq` then knows a missing row below it was pruned,
                    # not never seen (claiming a never-seen command would stop the CP from resending it).
                    floor = self._commands.last_terminal_seq()
                    where = "touched <= ? AND seq <= ? AND status IN ('completed','failed','cancelled')"
                    args = (self._counter - COMMANDS_KEPT, floor)
                    top = self._db.execute(f"SELECT MAX(seq) FROM commands WHERE {where}", args).fetchone()[0]
                    if top is not None:
                        self._db.execute(f"DELETE FROM commands WHERE {where}", args)
                        pruned = max(int(top), self._meta("commands_pruned_through", 0))
                        self._set_meta("commands_pruned_through", pruned)
            # Committed: now the mirror (under the same lock, so it follows the database's order).
            for touched, c in enumerate(commands, start=first):
                self._commands.put(c, touched)
            if prune:
                # The commands just saved may be pruned too, so the mirror prunes after the puts.
                top_gone = self._commands.prune(*args)
                if top_gone is not None:
                    self._commands.pruned_through = max(top_gone, self._commands.pruned_through)

    def last_command_seq(self) -> int:
        """The highest seq such that every command up to it has a terminal status (0 for none).

        Commands are numbered from 1 by the CP; a gap (a seq never seen) stops the scan, because the
        CP must resend that command. Rows at or below `commands_pruned_through` were pruned from the
        terminal prefix, so the scan continues above that mark. From memory, like `command()`.
        """
        return self._commands.last_terminal_seq()

    # -- runs ---------------------------------------------------------------------------------------
    def run_started(self, run_id: str, command_id: str, started_at: str) -> None:
        with self._lock, self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO runs(run_id, command_id, started_at) VALUES(?, ?, ?)",
                (run_id, command_id, started_at),
            )
            # Ended runs are only kept to mirror their terminal into a command status after a restart.
            self._db.execute(
                "DELETE FROM runs WHERE terminal IS NOT NULL AND rowid <= (SELECT MAX(rowid) FROM runs) - ?",
                (RUNS_KEPT,),
            )

    def run_ended(self, run_id: str) -> None:
        with self._lock, self._tx():
            self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    def open_commands(self) -> list[StoredCommand]:
        """Commands accepted by an earlier process that never reached a terminal status."""
        with self._lock:
            rows = self._db.execute(
                "SELECT command_id, seq, fingerprint, status, update_frame, kind FROM commands "
                "WHERE status NOT IN ('completed','failed','cancelled') ORDER BY seq"
            ).fetchall()
        return [StoredCommand(r[0], int(r[1]), r[2], r[3], None, r[5]) for r in rows]

    def active_runs(self) -> list[tuple[str, str]]:
        """Runs started whose terminal was never journaled: (run_id, command_id)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id, command_id FROM runs WHERE terminal IS NULL ORDER BY started_at"
            ).fetchall()
        return [(str(r), str(c)) for r, c in rows]

    def derived_count(self, run_id: str) -> int:
        """How many lossless events derived from provider output the run has journaled (reattach)."""
        with self._lock:
            row = self._db.execute("SELECT derived FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0]) if row else 0

    def ended_run_of(self, command_id: str) -> EndedRun | None:
        """The run `command_id` started, if its terminal was journaled."""
        with self._lock:
            row = self._db.execute(
                "SELECT run_id, command_id, terminal, error FROM runs WHERE command_id = ? AND terminal IS NOT NULL",
                (command_id,),
            ).fetchone()
        if row is None:
            return None
        error = msgspec.json.decode(row[3]) if row[3] else None
        return EndedRun(str(row[0]), str(row[1]), str(row[2]), error if isinstance(error, dict) else None)

    # -- texts and the transcript (PROTOCOL §8) --------------------------------------------------------
    def text(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM texts WHERE key = ?", (key,)).fetchone()
        return str(row[0]) if row else None

    def set_text(self, key: str, value: str | None) -> None:
        with self._lock, self._tx():
            if value is None:
                self._db.execute("DELETE FROM texts WHERE key = ?", (key,))
            else:
                self._db.execute(
                    "INSERT INTO texts(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )

    def transcript(self) -> list[tuple[str, str]]:
        """(role, text) of the kept transcript, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT role, text FROM transcript ORDER BY id").fetchall()
        return [(str(r), str(t)) for r, t in rows]

    def transcript_append(self, role: str, text: str, max_bytes: int = TRANSCRIPT_MAX_BYTES) -> None:
        """Append one message and drop the oldest ones beyond `max_bytes` of text (UTF-8)."""
        with self._lock, self._tx():
            self._db.execute("INSERT INTO transcript(role, text) VALUES(?, ?)", (role, text))
            total = 0
            keep_from: int | None = None
            for row_id, size in self._db.execute(
                "SELECT id, length(CAST(text AS BLOB)) FROM transcript ORDER BY id DESC"
            ):
                total += int(size)
                if total > max_bytes:
                    keep_from = int(row_id) + 1
                    break
            if keep_from is not None:
                self._db.execute("DELETE FROM transcript WHERE id < ?", (keep_from,))

    def transcript_clear(self) -> None:
        with self._lock, self._tx():
            self._db.execute("DELETE FROM transcript")

    # -- helpers ------------------------------------------------------------------------------------
    def _tx(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
