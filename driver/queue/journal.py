"""The driver's durable state under `state_dir`: one SQLite database in WAL mode.

It holds the lossless outbox (each event's full encoded bytes, keyed by `seq` and unique `event_id`),
the epoch and the seq reservation, command terminal statuses (so idempotency survives a restart), and
the run that is active (so the next process can end it `driver.restarted`).

Every row carries an HMAC (driver/queue/rowmac.py) and is checked where it is read back; a row that
fails is set aside and reported (`findings`), never sent or acted on (PROTOCOL §4.1, §9).

This module is synchronous and small on purpose: `driver.queue.outbox_writer` calls `commit` from a
worker thread for every event, deletion and command status (ONE writer, in order); the rare writes
of runs, texts and the transcript are in `journal_state`. A lock serialises access because the
connection is shared between threads.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from driver.queue import asked
from driver.queue.command_index import CommandIndex, StoredCommand
from driver.queue.journal_commands import PRUNED_RANGES_KEY, JournalCommands
from driver.queue.journal_rows import CRASH, Finding, row_blob
from driver.queue.journal_state import EndedRun, JournalState
from driver.queue.rowmac import UNKEYED, RowMac
from driver.queue.schema import (
    DERIVED_KINDS,
    MIGRATIONS,
    RUN_TERMINAL_KINDS,
    SCHEMA,
    SEQ_BLOCK,
    SET_ASIDE_KEPT,
    terminal_error,
)
from driver.queue.transaction import Transaction

# How far a tampered epoch is raised: an agent that lowered it cannot make the next ids repeat unless it
# lowered it by more than this (and the seq reservation, checked the same way, jumps too).
EPOCH_JUMP = 1024
__all__ = ["PRUNED_RANGES_KEY", "EndedRun", "EventMeta", "Journal", "JournaledEvent"]


class JournaledEvent(NamedTuple):
    """One outbox row, in column order (a tuple, so a group commit hands rows to SQLite as they are)."""

    seq: int
    event_id: str
    run_id: str | None
    kind: str
    body: bytes


class EventMeta(NamedTuple):
    seq: int
    event_id: str
    run_id: str | None
    kind: str
    size: int


class Journal(JournalCommands, JournalState):
    def __init__(self, path: Path, *, synchronous: str = "FULL", mac: RowMac = UNKEYED) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.mac = mac
        self._lock = threading.Lock()
        self.findings: list[Finding] = []  # rows set aside, for the kernel to report (take_findings)
        # Its own lock: the kernel takes findings on the event loop, which must never wait for the
        # journal's lock (held through a commit's fsync).
        self._findings_lock = threading.Lock()
        self._reported: set[tuple[str, str]] = set()
        # Create the file private before SQLite opens it: SQLite gives the -wal and -shm files (which hold
        # the same event payloads) the database file's mode, so a later chmod alone would leave them 0644.
        os.close(os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o600))
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: every commit fsyncs the WAL, so a receipt-less event survives power loss, not just a crash.
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.executescript(SCHEMA)
        self._migrate()
        with self._lock, self._tx():
            self._counter = max(self._meta("touch_counter", 0, lowest=0), self._max_touched())
            self._commands = CommandIndex(self._meta("commands_pruned_through", 0, lowest=0), self._pruned_ranges())
            self._load_commands()
            # Commands whose status row failed its check (now or in an earlier process): never executed
            # again when the CP resends them (their first execution may have happened), see CommandDesk.
            self.set_aside_commands = {
                str(r[0]) for r in self._db.execute("SELECT key FROM set_aside WHERE source = 'commands'")
            }
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

    # -- findings -----------------------------------------------------------------------------------
    def _found(self, table: str, key: object, reason: str) -> None:
        if (table, str(key)) not in self._reported:
            self._reported.add((table, str(key)))
            with self._findings_lock:
                self.findings.append(Finding(table, str(key), reason))

    def take_findings(self) -> list[Finding]:
        with self._findings_lock:
            out, self.findings = self.findings, []
        return out

    def _set_aside(
        self, table: str, key: object, reason: str, values: tuple[object, ...], *, report: bool = True
    ) -> None:
        """Keep a copy of a refused row in `set_aside` (inside the caller's transaction); `report`
        False when the caller has reported it already (the outbox, when it read the row back)."""
        self._db.execute(
            "INSERT INTO set_aside(source, key, reason, row) VALUES(?, ?, ?, ?)",
            (table, str(key), reason, row_blob(values)),
        )
        self._db.execute(
            "DELETE FROM set_aside WHERE id <= (SELECT MAX(id) FROM set_aside) - ?",
            (SET_ASIDE_KEPT,),
        )
        if report:
            self._found(table, key, reason)

    # -- meta ---------------------------------------------------------------------------------------
    def _meta(self, key: str, default: int, *, lowest: int | None = None) -> int:
        """A counter. One that fails its check is reported and replaced by `lowest` when given, else
        taken as stored (the callers that use it only ever raise it, see `bump_epoch`)."""
        return self._meta_checked(key, default, lowest=lowest)[0]

    def _meta_checked(self, key: str, default: int, *, lowest: int | None = None) -> tuple[int, bool]:
        """(value, passed its check): a missing row passes, with `default`."""
        row = self._db.execute("SELECT value, mac FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            return default, True
        value, mac = row
        if self.mac.check(mac, "meta", key, value):
            return int(value), True
        self._found("meta", key, "mac")
        if lowest is not None or not isinstance(value, int):
            return (lowest if lowest is not None else default), False
        return value, False

    def _set_meta(self, key: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO meta(key, value, mac) VALUES(?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, mac = excluded.mac",
            (key, value, self.mac.of("meta", key, value)),
        )

    def bump_epoch(self) -> int:
        """Increment and return the epoch: 1 for the first process of this state_dir. A stored epoch
        that fails its check may have been lowered (to make ids repeat): it is jumped far above what
        is stored instead (epochs may have gaps)."""
        with self._lock, self._tx():
            stored, ok = self._meta_checked("epoch", 0)
            epoch = stored + 1 if ok else max(stored, 0) + 1 + EPOCH_JUMP
            self._set_meta("epoch", epoch)
            return epoch

    def reserve_seqs(self) -> tuple[int, int]:
        """Reserve the next block of seqs; return (first, end) with end exclusive."""
        with self._lock, self._tx():
            stored, ok = self._meta_checked("seq_reserved", 0)
            start = max(stored, 0) + 1
            if not ok:
                # Edited: the true reservation may be higher than what is stored. Seqs may have gaps
                # (best-effort events use seqs that are never stored), so jump far above it.
                start += SEQ_BLOCK * 1024
            top = self._db.execute("SELECT MAX(seq) FROM outbox").fetchone()[0]
            if isinstance(top, int):
                start = max(start, top + 1)
            end = start + SEQ_BLOCK
            self._set_meta("seq_reserved", end - 1)
            return start, end

    # -- outbox -------------------------------------------------------------------------------------
    def append(self, events: Iterable[JournaledEvent]) -> None:
        """Write events in one transaction (tests; the driver's writes go through `commit`)."""
        self.commit(events, ())

    def delete(self, seqs: Iterable[int]) -> None:
        self.commit((), seqs)

    def commit(
        self,
        events: Iterable[tuple[int, str, str | None, str, bytes]],
        deleted: Iterable[int],
        reserve_through: int = 0,
        statuses: Iterable[StoredCommand] = (),
        set_aside: Iterable[tuple[int, str]] = (),
        replaced: Iterable[tuple[int, bytes]] = (),
    ) -> None:
        """ONE transaction (one fsync) for everything the writer took, in this order: new events, the
        command statuses whose facts are among them (or need none), deletions of receipted events, rows
        set aside, cut bodies, and the seq reservation. A status and its `command.finished` therefore
        become durable together, and the mirror of statuses changes only after the commit."""
        rows = list(events)
        gone = [(s,) for s in deleted]
        saved = list(statuses)
        aside = list(set_aside)
        cut = list(replaced)
        if not (rows or gone or reserve_through or saved or aside or cut):
            return
        crash = CRASH.reached if CRASH.armed else None
        kinds = (bool(rows), bool(gone or aside), bool(saved))
        with self._lock:
            if crash:
                crash("before", *kinds)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if reserve_through > self._meta("seq_reserved", 0):
                    self._set_meta("seq_reserved", reserve_through)
                if rows:
                    self._insert_events(rows)
                pruned = self._save_statuses(saved) if saved else None
                if gone:
                    self._db.executemany("DELETE FROM outbox WHERE seq = ?", gone)
                for seq, reason in aside:
                    self._set_aside_event(seq, reason, report=False)
                for seq, body in cut:
                    self._replace_body(seq, body)
                if crash:
                    crash("inside", *kinds)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            if crash:
                crash("after", *kinds)
            if saved:
                self._mirror(saved, pruned)

    def _insert_events(self, rows: list[tuple[int, str, str | None, str, bytes]]) -> None:
        mac = self.mac.event
        self._db.executemany(
            "INSERT OR IGNORE INTO outbox(seq, event_id, run_id, kind, body, mac) VALUES(?, ?, ?, ?, ?, ?)",
            [(*r, mac(*r)) for r in rows],
        )
        # A run stops being active in the same transaction that makes its terminal durable, so a restart
        # can never see an active run whose terminal is already on its way; the terminal is remembered
        # so the run's command status can mirror it after a restart.
        # The run's count of derived lossless events (PROTOCOL §8.2 reattach: a successor re-derives
        # them from the keeper's log and suppresses that many) moves in this same transaction, so the
        # count never disagrees with the events journaled.
        ended: dict[str, tuple[str, str | None]] = {}
        derived: dict[str, int] = {}
        for _, _, run_id, kind, body in rows:
            if not run_id:
                continue
            if kind in RUN_TERMINAL_KINDS:
                ended[run_id] = (kind, terminal_error(body))
            elif kind in DERIVED_KINDS:
                derived[run_id] = derived.get(run_id, 0) + 1
        for run_id in ended.keys() | derived.keys():
            self._run_update(run_id, ended.get(run_id), derived.get(run_id, 0))
        # The permission requests each run has open, as the CP saw them (driver/queue/asked.py), move in
        # this transaction too: a successor adopts exactly the request_ids that became durable.
        for _, _, run_id, kind, body in rows:
            if run_id and kind in asked.KINDS:
                self._permission_update(run_id, kind, body)
            elif kind in asked.HOST_CALL_KINDS:
                self._host_call_update(body)
        for run_id in ended:
            self._permissions_forget(run_id)

    def _set_aside_event(self, seq: int, reason: str, *, report: bool = True) -> None:
        row = self._db.execute("SELECT seq, event_id, run_id, kind, body FROM outbox WHERE seq = ?", (seq,)).fetchone()
        if row is not None:
            self._set_aside("outbox", seq, reason, tuple(row), report=report)
            self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    def _replace_body(self, seq: int, body: bytes) -> None:
        """PROTOCOL §4.3's cut form of an oversize event, so every later send carries the same bytes."""
        row = self._db.execute("SELECT event_id, run_id, kind FROM outbox WHERE seq = ?", (seq,)).fetchone()
        if row is not None:
            mac = self.mac.event(seq, row[0], row[1], row[2], body)
            self._db.execute("UPDATE outbox SET body = ?, mac = ? WHERE seq = ?", (body, mac, seq))

    def replace_body(self, seq: int, body: bytes) -> None:
        self.commit((), (), replaced=[(seq, body)])

    def bodies(self, seqs: list[int]) -> tuple[dict[int, bytes], list[int]]:
        """Bodies of committed events whose row passes its check, and the seqs whose row does not (to be
        set aside by the writer). A seq whose row is gone is in neither."""
        with self._reader_lock:
            out: dict[int, bytes] = {}
            bad: list[int] = []
            check = self.mac.check_event
            for i in range(0, len(seqs), 500):
                chunk = seqs[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for seq, event_id, run_id, kind, body, mac in self._reader.execute(
                    f"SELECT seq, event_id, run_id, kind, body, mac FROM outbox WHERE seq IN ({marks})", chunk
                ):
                    if check(mac, seq, event_id, run_id, kind, body):
                        out[int(seq)] = body
                    else:
                        bad.append(int(seq))
            return out, bad

    def pending(self) -> Iterator[EventMeta]:
        """(seq, event_id, run_id, kind, size) of every journaled event, oldest first, without bodies.
        Their MACs are checked when their bodies are read back to be sent (`bodies`); a row with
        values of a type the driver never writes is set aside here already.

        In chunks by seq: all rows at once peaked at ~300 MB for a million pending events, where the
        outbox keeps ~22 bytes of each."""
        after = -1
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT seq, event_id, run_id, kind, length(body), typeof(body) FROM outbox "
                    "WHERE seq > ? ORDER BY seq LIMIT 8192",
                    (after,),
                ).fetchall()
                bad = [r for r in rows if not _well_typed(r)]
                if bad:
                    with self._tx():
                        for r in bad:
                            self._set_aside_event(int(r[0]), "type")
            for seq, event_id, run_id, kind, size, kind_of_body in rows:
                if _well_typed((seq, event_id, run_id, kind, size, kind_of_body)):
                    yield EventMeta(seq, event_id, run_id, kind, size)
            if len(rows) < 8192:
                return
            after = int(rows[-1][0])

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
        """Save statuses in ONE transaction (tests; the driver's go through `commit`)."""
        self.commit((), (), statuses=commands)

    # -- helpers ------------------------------------------------------------------------------------
    def _tx(self) -> Transaction:
        return Transaction(self._db)


def _well_typed(row: tuple[object, ...]) -> bool:
    seq, event_id, run_id, kind, size, body_type = row
    return (
        isinstance(seq, int)
        and isinstance(event_id, str)
        and (run_id is None or isinstance(run_id, str))
        and isinstance(kind, str)
        and isinstance(size, int)
        and body_type == "blob"
    )

