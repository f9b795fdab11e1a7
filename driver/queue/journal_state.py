"""The journal's rare writes and reads: runs, texts (the native ref and markers) and the transcript.

A mixin of `Journal` (same connection, lock and MAC), apart so each module keeps one job. Every row is
authenticated like the outbox's: a row that fails its check is set aside, reported, and treated as
absent (a run never started, no native ref, a message never said).
"""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING

import msgspec

from driver.queue import asked
from driver.queue.schema import RUNS_KEPT, TRANSCRIPT_MAX_BYTES

if TYPE_CHECKING:
    from driver.queue.rowmac import RowMac
    from driver.queue.transaction import Transaction


class EndedRun(msgspec.Struct, frozen=True):
    """A run whose terminal was journaled: its kind and, for `run.failed`, the error payload."""

    run_id: str
    command_id: str
    terminal: str
    error: dict[str, object] | None


class JournalState:
    _db: sqlite3.Connection
    _lock: threading.Lock
    mac: RowMac

    if TYPE_CHECKING:

        def _tx(self) -> Transaction: ...
        def _set_aside(self, table: str, key: object, reason: str, values: tuple[object, ...]) -> None: ...

    # -- runs ---------------------------------------------------------------------------------------
    def _run_mac(
        self, run_id: object, command_id: object, started_at: object, terminal: object, error: object, derived: object
    ) -> bytes:
        # `derived` (the reattach's count of derived lossless events, driver/keeper/reattach.py) is covered too:
        # an agent that lowered it would make a successor send journaled events twice.
        return self.mac.of("runs", run_id, command_id, started_at, terminal, error, derived)  # type: ignore[arg-type]

    def run_started(self, run_id: str, command_id: str, started_at: str) -> None:
        with self._lock, self._tx():
            self._db.execute(
                "INSERT OR REPLACE INTO runs(run_id, command_id, started_at, derived, mac) VALUES(?, ?, ?, 0, ?)",
                (run_id, command_id, started_at, self._run_mac(run_id, command_id, started_at, None, None, 0)),
            )
            # Ended runs are only kept to mirror their terminal into a command status after a restart.
            self._db.execute(
                "DELETE FROM runs WHERE terminal IS NOT NULL AND rowid <= (SELECT MAX(rowid) FROM runs) - ?",
                (RUNS_KEPT,),
            )

    def _run_update(self, run_id: str, ended: tuple[str, str | None] | None, derived_add: int) -> None:
        """Inside the commit that journals the run's events: its terminal (kind, error) if one is among
        them, and how many derived lossless events they add (PROTOCOL §8.2, driver/keeper/reattach.py). The row
        is re-authenticated from its stored values, so a row already tampered with stays failing."""
        row = self._db.execute(
            "SELECT command_id, started_at, terminal, error, derived FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
        if row is None:
            return
        terminal, error = ended if ended is not None else (row[2], row[3])
        derived = (row[4] if isinstance(row[4], int) else 0) + derived_add
        mac = self._run_mac(run_id, row[0], row[1], terminal, error, derived)
        self._db.execute(
            "UPDATE runs SET terminal = ?, error = ?, derived = ?, mac = ? WHERE run_id = ?",
            (terminal, error, derived, mac, run_id),
        )

    def run_ended(self, run_id: str) -> None:
        with self._lock, self._tx():
            self._db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    def _runs(self, where: str, args: tuple[object, ...]) -> list[tuple[str, str, str, str | None, str | None, int]]:
        """Rows of `runs` that pass their check (with `derived` last); the others are set aside."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT run_id, command_id, started_at, terminal, error, derived, mac FROM runs WHERE {where}", args
            ).fetchall()
            good: list[tuple[object, ...]] = []
            bad: list[tuple[object, ...]] = []
            for r in rows:
                (good if self.mac.check(r[6], "runs", *r[:6]) else bad).append(r)
            if bad:
                with self._tx():
                    for r in bad:
                        self._set_aside("runs", r[0], "mac", tuple(r[:6]))
                        self._db.execute("DELETE FROM runs WHERE run_id = ?", (r[0],))
        return [tuple(r[:6]) for r in good]  # type: ignore[misc]

    def active_runs(self) -> list[tuple[str, str]]:
        """Runs started whose terminal was never journaled: (run_id, command_id)."""
        rows = self._runs("terminal IS NULL ORDER BY started_at", ())
        return [(r[0], r[1]) for r in rows]

    def run_known(self, run_id: str) -> bool:
        """Whether `run_id` was started (or ended queued) by this state_dir's driver: one of the newest
        RUNS_KEPT ended runs or an active one (PROTOCOL §9 "Identities are not reused")."""
        return bool(self._runs("run_id = ?", (run_id,)))

    def derived_count(self, run_id: str) -> int:
        """How many lossless events derived from provider output the run has journaled (reattach). A
        row that fails its check is set aside like any other: the run is then not active either."""
        rows = self._runs("run_id = ?", (run_id,))
        return int(rows[0][5]) if rows else 0

    def ended_run_of(self, command_id: str) -> EndedRun | None:
        """The run `command_id` started, if its terminal was journaled."""
        rows = self._runs("command_id = ? AND terminal IS NOT NULL", (command_id,))
        if not rows:
            return None
        run_id, cid, _, terminal, raw, _ = rows[0]
        try:
            error = msgspec.json.decode(raw) if raw else None
        except msgspec.DecodeError:
            error = None
        return EndedRun(run_id, cid, str(terminal), error if isinstance(error, dict) else None)

    def has_terminal(self, run_id: str) -> bool:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, event_id, run_id, kind, body, mac FROM outbox "
                "WHERE run_id = ? AND kind IN ('run.completed','run.failed','run.cancelled')",
                (run_id,),
            ).fetchall()
        return any(self.mac.check_event(r[5], *r[:5]) for r in rows)

    # -- texts (PROTOCOL §8) ----------------------------------------------------------------------------
    def _text_checked(self, key: str) -> str | None:
        """The text under `key` (the caller holds the lock, inside a transaction when it may set aside)."""
        row = self._db.execute("SELECT value, mac FROM texts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if self.mac.check(row[1], "texts", key, row[0]):
            return str(row[0])
        self._set_aside("texts", key, "mac", (key, row[0]))
        self._db.execute("DELETE FROM texts WHERE key = ?", (key,))
        return None

    def _set_text_row(self, key: str, value: str) -> None:
        self._db.execute(
            "INSERT INTO texts(key, value, mac) VALUES(?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value, mac = excluded.mac",
            (key, value, self.mac.of("texts", key, value)),
        )

    def text(self, key: str) -> str | None:
        with self._lock, self._tx():
            return self._text_checked(key)

    def set_text(self, key: str, value: str | None) -> None:
        with self._lock, self._tx():
            if value is None:
                self._db.execute("DELETE FROM texts WHERE key = ?", (key,))
            else:
                self._set_text_row(key, value)

    # -- the permission requests a run has open (PROTOCOL §8.2, driver/queue/asked.py) ------------
    def _permission_update(self, run_id: str, kind: str, body: bytes) -> None:
        if kind == "permission.requested":
            change = asked.requested(body)
        else:
            request_id = asked.request_id_of(body)
            before = self._text_checked(asked.key_of(run_id, request_id)) if request_id else None
            change = asked.resolved(body, before)
        if change is not None:
            self._set_text_row(asked.key_of(run_id, change[0]), change[1])

    def _permissions_forget(self, run_id: str) -> None:
        prefix = asked.run_prefix(run_id)
        self._db.execute(  # not a run whose id starts with this one's and a slash
            "DELETE FROM texts WHERE substr(key, 1, ?) = ? AND instr(substr(key, ?), '/') = 0",
            (len(prefix), prefix, len(prefix) + 1),
        )

    def asked_permissions(self, run_id: str) -> list[asked.Asked]:
        """The permission requests `run_id` has journaled and not yet ended with the run (open or
        decided), oldest first; records that fail their check are set aside, not returned."""
        prefix = asked.run_prefix(run_id)
        out = []
        with self._lock, self._tx():
            for key, value in self._texts_under(prefix):
                if "/" in key[len(prefix) :]:
                    continue  # another run's, whose id starts with this one's and a slash
                if (record := asked.parse(key, value)) is not None:
                    out.append(record)
        return out

    def _texts_under(self, prefix: str) -> list[tuple[str, str]]:
        """(key, value) of the texts whose key starts with `prefix`, oldest first, those that pass their
        check (the others are set aside). The caller holds the lock, inside a transaction."""
        keys = [
            str(r[0])
            for r in self._db.execute(
                "SELECT key FROM texts WHERE substr(key, 1, ?) = ? ORDER BY rowid", (len(prefix), prefix)
            ).fetchall()
        ]
        return [(key, value) for key in keys if (value := self._text_checked(key)) is not None]

    def _host_call_update(self, body: bytes) -> None:
        change = asked.host_call(body)
        if change is None:
            return
        key, value = change
        if value is None:
            self._db.execute("DELETE FROM texts WHERE key = ?", (key,))
        else:
            self._set_text_row(key, value)

    def open_host_calls(self) -> list[str]:
        """The call_ids of host tool calls a `host_tool.called` announced and no `host_tool.resolved`
        settled (a dead predecessor's), oldest first; records that fail their check are set aside."""
        prefix = asked.HOST_CALL_PREFIX
        with self._lock, self._tx():
            return [key[len(prefix) :] for key, _ in self._texts_under(prefix)]

    # -- the transcript (PROTOCOL §8) ---------------------------------------------------------------
    def transcript(self) -> list[tuple[str, str]]:
        """(role, text) of the kept transcript, oldest first (rows that fail their check left out)."""
        with self._lock:
            rows = self._db.execute("SELECT id, role, text, mac FROM transcript ORDER BY id").fetchall()
            bad = [r for r in rows if not self.mac.check(r[3], "transcript", r[0], r[1], r[2])]
            if bad:
                with self._tx():
                    for r in bad:
                        self._set_aside("transcript", r[0], "mac", tuple(r[:3]))
                        self._db.execute("DELETE FROM transcript WHERE id = ?", (r[0],))
        gone = {r[0] for r in bad}
        return [(str(r[1]), str(r[2])) for r in rows if r[0] not in gone]

    def transcript_append(self, role: str, text: str, max_bytes: int = TRANSCRIPT_MAX_BYTES) -> None:
        """Append one message and drop the oldest ones beyond `max_bytes` of text (UTF-8)."""
        with self._lock, self._tx():
            top = self._db.execute("SELECT MAX(id) FROM transcript").fetchone()[0]
            seq_row = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'transcript'").fetchone()
            row_id = max(top if isinstance(top, int) else 0, int(seq_row[0]) if seq_row else 0) + 1
            self._db.execute(
                "INSERT INTO transcript(id, role, text, mac) VALUES(?, ?, ?, ?)",
                (row_id, role, text, self.mac.of("transcript", row_id, role, text)),
            )
            total = 0
            keep_from: int | None = None
            for rid, size in self._db.execute("SELECT id, length(CAST(text AS BLOB)) FROM transcript ORDER BY id DESC"):
                total += int(size)
                if total > max_bytes:
                    keep_from = int(rid) + 1
                    break
            if keep_from is not None:
                self._db.execute("DELETE FROM transcript WHERE id < ?", (keep_from,))

    def transcript_clear(self) -> None:
        with self._lock, self._tx():
            self._db.execute("DELETE FROM transcript")
