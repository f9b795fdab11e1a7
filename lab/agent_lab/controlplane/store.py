"""The reference control plane's durable store: SQLite in WAL mode with `synchronous=FULL`.

Every write method commits before it returns, so a receipt built from its result is only ever sent
for events that are on disk. One `Store` object owns one connection and must be used from the thread
that created it: the server keeps a writer in a dedicated thread and a reader on the event loop thread
(WAL lets the reader see every committed write without blocking the writer).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent_lab.controlplane import checkpoints
from agent_lab.controlplane.store_rows import (
    COMMAND_COLUMNS,
    EVENT_COLUMNS,
    PENDING,
    SCHEMA,
    BatchResult,
    CommandExists,
    EpochVerdict,
    StoredRejection,
    Superseded,
    command_row,
    event_row,
    loads_or_none,
    now_iso,
)
from agent_lab.controlplane.validation import ValidEvent
from driver.protocol.frames import TERMINAL_STATUSES

# The records moved to store_rows; importers keep taking them from here.
__all__ = ["BatchResult", "CommandExists", "EpochVerdict", "Store", "StoredRejection", "Superseded", "now_iso"]


class Store:
    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        # Autocommit mode: writes open their own explicit transactions, reads see the latest commit.
        self._db = sqlite3.connect(str(self.path), isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._depth = 0  # open transaction nesting (see _Transaction)
        self._db.execute("PRAGMA busy_timeout = 5000")
        if create:
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.executescript(SCHEMA)
            self._db.executescript(checkpoints.SCHEMA)
            columns = {r["name"] for r in self._db.execute("PRAGMA table_info(instances)")}
            if "link_generation" not in columns:  # a database from before the link generation
                self._db.execute("ALTER TABLE instances ADD COLUMN link_generation INTEGER NOT NULL DEFAULT 0")
        # FULL: the WAL is fsync'd at every commit, so "committed" means "survives power loss".
        self._db.execute("PRAGMA synchronous = FULL")

    def close(self) -> None:
        self._db.close()

    # -- writes ---------------------------------------------------------------------------------

    def observe_epoch(self, instance_id: str, epoch: int) -> EpochVerdict:
        """Claim the instance for a link at `epoch` unless a higher one was already seen (then refuse
        it); an allowed claim takes the next link generation, which fences the older link's batches."""
        with self._tx():
            row = self._db.execute(
                "SELECT highest_epoch, terminated_at, link_generation FROM instances WHERE instance_id = ?",
                (instance_id,),
            ).fetchone()
            highest = 0 if row is None else int(row["highest_epoch"])
            if row is not None and row["terminated_at"] is not None:
                return EpochVerdict(False, highest, terminated=True)
            if epoch < highest:
                return EpochVerdict(False, highest)
            generation = 1 if row is None else int(row["link_generation"]) + 1
            self._db.execute(
                "INSERT INTO instances (instance_id, highest_epoch, updated_at, link_generation) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (instance_id) DO UPDATE SET highest_epoch = excluded.highest_epoch, "
                "updated_at = excluded.updated_at, link_generation = excluded.link_generation",
                (instance_id, epoch, now_iso(), generation),
            )
            return EpochVerdict(True, epoch, generation=generation)

    claim = observe_epoch

    def terminate(self, instance_id: str) -> None:
        """Mark the instance terminated: every later link is refused with 4410."""
        stamp = now_iso()
        with self._tx():
            self._db.execute(
                "INSERT INTO instances (instance_id, highest_epoch, terminated_at, updated_at) "
                "VALUES (?, 0, ?, ?) ON CONFLICT (instance_id) DO UPDATE SET "
                "terminated_at = excluded.terminated_at, updated_at = excluded.updated_at",
                (instance_id, stamp, stamp),
            )

    def insert_events(
        self,
        instance_id: str,
        events: Sequence[ValidEvent],
        rejected: Iterable[StoredRejection] = (),
        generation: int | None = None,
    ) -> BatchResult:
        """Store a batch in one transaction; a duplicate of a stored event is accepted again. With a
        `generation`, the batch is stored only while that link generation holds (else `Superseded`).

        Duplicates are rare (a resend after a lost receipt), so the batch's ids are looked up once and
        the new events inserted with one executemany, rather than one statement per event."""
        result = BatchResult(accepted=[], rejected=list(rejected), stored=[])
        stamp = now_iso()
        with self._tx():
            if generation is not None:
                row = self._db.execute(
                    "SELECT link_generation FROM instances WHERE instance_id = ?", (instance_id,)
                ).fetchone()
                if row is None or int(row[0]) != generation:
                    raise Superseded(f"link generation {generation} of {instance_id} no longer holds")
            known: dict[str, str] = {}
            ids = [ev.event_id for ev in events]
            for i in range(0, len(ids), 500):
                chunk = ids[i : i + 500]
                marks = ",".join("?" * len(chunk))
                for row in self._db.execute(
                    f"SELECT event_id, digest FROM events WHERE instance_id = ? AND event_id IN ({marks})",
                    (instance_id, *chunk),
                ):
                    known[row["event_id"]] = row["digest"]
            fresh: list[ValidEvent] = []
            seen: set[str] = set()
            for ev in events:
                if ev.event_id in known or ev.event_id in seen:
                    digest = known.get(ev.event_id) or next(f.digest for f in fresh if f.event_id == ev.event_id)
                    if digest == ev.digest:
                        result.accepted.append(ev.event_id)
                    else:
                        result.rejected.append(
                            StoredRejection(
                                event_id=ev.event_id,
                                code="event.conflict",
                                message="an event with this event_id and different content is already stored",
                                retryable=False,
                            )
                        )
                    continue
                seen.add(ev.event_id)
                refused = self._apply_checkpoint(instance_id, ev, stamp)
                if refused is not None:
                    result.rejected.append(refused)
                    continue
                fresh.append(ev)
            self._db.executemany(
                f"INSERT INTO events ({EVENT_COLUMNS}, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        instance_id,
                        ev.event_id,
                        ev.seq,
                        ev.epoch,
                        ev.kind,
                        ev.delivery,
                        ev.session_id,
                        ev.run_id,
                        ev.occurred_at,
                        ev.payload_json,
                        stamp,
                        ev.digest,
                    )
                    for ev in fresh
                ],
            )
            for ev in fresh:
                if ev.kind == "command.finished":
                    self._apply_finished(instance_id, ev.payload_json, stamp)
            result.accepted.extend(ev.event_id for ev in fresh)
            result.stored = fresh
            result.stored_at = stamp
        return result

    def _apply_checkpoint(self, instance_id: str, ev: ValidEvent, stamp: str) -> StoredRejection | None:
        """PROTOCOL §8.1: reassemble a checkpoint's chunks as they are stored; a rejection when refused."""
        if not ev.kind.startswith("checkpoint."):
            return None
        try:
            with self._tx():  # a savepoint: a refused event leaves nothing behind
                payload = json.loads(ev.payload_json)
                if ev.kind == "checkpoint.file":
                    checkpoints.apply_file(self._db, instance_id, payload)
                else:
                    checkpoints.apply_recorded(self._db, instance_id, payload, stamp)
        except checkpoints.CheckpointRefused as exc:
            return StoredRejection(
                event_id=ev.event_id, code="checkpoint.incomplete", message=str(exc), retryable=False
            )
        return None

    def checkpoints(self, instance_id: str) -> list[dict[str, Any]]:
        return checkpoints.listing(self._db, instance_id)

    def latest_checkpoint(self, instance_id: str) -> dict[str, Any] | None:
        return checkpoints.latest(self._db, instance_id)

    def checkpoint_blob(self, sha256: str) -> bytes | None:
        return checkpoints.blob(self._db, sha256)

    def add_command(
        self, instance_id: str, kind: str, fields: dict[str, Any], command_id: str | None = None
    ) -> dict[str, Any]:
        """Store a new command with the next seq of its instance; returns the stored command."""
        command_id = command_id or f"cmd-{uuid.uuid4().hex}"
        stamp = now_iso()
        with self._tx():
            if self._db.execute("SELECT 1 FROM commands WHERE command_id = ?", (command_id,)).fetchone():
                raise CommandExists(f"command {command_id} already exists")
            seq = int(
                self._db.execute(
                    "SELECT COALESCE(MAX(seq), 0) + 1 FROM commands WHERE instance_id = ?", (instance_id,)
                ).fetchone()[0]
            )
            body = {**fields, "type": "command", "command_id": command_id, "seq": seq, "kind": kind}
            self._db.execute(
                f"INSERT INTO commands ({COMMAND_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
                (instance_id, seq, command_id, kind, json.dumps(body), PENDING, stamp, stamp),
            )
        command = self.command(command_id)
        assert command is not None
        return command

    def record_update(
        self,
        instance_id: str,
        command_id: str,
        status: str,
        result: dict[str, Any] | None,
        error: dict[str, Any] | None,
    ) -> bool:
        """Append to the update history; move the command's status unless it is already terminal.

        Returns whether the command's current status changed.
        """
        stamp = now_iso()
        result_json = None if result is None else json.dumps(result)
        error_json = None if error is None else json.dumps(error)
        with self._tx():
            return self._apply_update(instance_id, command_id, status, result_json, error_json, stamp)

    def _apply_update(
        self,
        instance_id: str,
        command_id: str,
        status: str,
        result_json: str | None,
        error_json: str | None,
        stamp: str,
    ) -> bool:
        terminal = tuple(sorted(TERMINAL_STATUSES))
        self._db.execute(
            "INSERT INTO command_updates (instance_id, command_id, status, result, error, received_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (instance_id, command_id, status, result_json, error_json, stamp),
        )
        cur = self._db.execute(
            "UPDATE commands SET status = ?, result = ?, error = ?, updated_at = ? "
            "WHERE command_id = ? AND instance_id = ? AND status NOT IN (?, ?, ?)",
            (status, result_json, error_json, stamp, command_id, instance_id, *terminal),
        )
        return cur.rowcount == 1

    def _apply_finished(self, instance_id: str, payload_json: str, stamp: str) -> None:
        """PROTOCOL §3: a `command.finished` event is applied like a terminal `command.update`, in the
        transaction that stores it (so its receipt means the status is applied too)."""
        payload = json.loads(payload_json)
        result, error = payload.get("result"), payload.get("error")
        self._apply_update(
            instance_id,
            str(payload["command_id"]),
            str(payload["status"]),
            None if result is None else json.dumps(result),
            None if error is None else json.dumps(error),
            stamp,
        )

    # -- reads ----------------------------------------------------------------------------------

    def link_generation(self, instance_id: str) -> int:
        row = self._db.execute("SELECT link_generation FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
        return 0 if row is None else int(row[0])

    def highest_epoch(self, instance_id: str) -> int:
        row = self._db.execute("SELECT highest_epoch FROM instances WHERE instance_id = ?", (instance_id,)).fetchone()
        return 0 if row is None else int(row["highest_epoch"])

    def events(
        self,
        instance_id: str,
        kinds: Iterable[str] | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        limit: int | None = None,
        delivery: str | None = None,
    ) -> list[dict[str, Any]]:
        """Stored events of an instance in `seq` order (store order breaks ties)."""
        sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE instance_id = ?"
        args: list[Any] = [instance_id]
        if kinds is not None:
            kind_list = list(kinds)
            sql += f" AND kind IN ({', '.join('?' for _ in kind_list)})"
            args += kind_list
        if run_id is not None:
            sql += " AND run_id = ?"
            args.append(run_id)
        if after_seq is not None:
            sql += " AND seq > ?"
            args.append(after_seq)
        if delivery is not None:
            sql += " AND delivery = ?"
            args.append(delivery)
        sql += " ORDER BY seq, id"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [event_row(r) for r in self._db.execute(sql, args)]

    def count_events(self, instance_id: str | None = None) -> int:
        if instance_id is None:
            return int(self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        return int(self._db.execute("SELECT COUNT(*) FROM events WHERE instance_id = ?", (instance_id,)).fetchone()[0])

    def commands(self, instance_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            f"SELECT {COMMAND_COLUMNS} FROM commands WHERE instance_id = ? ORDER BY seq", (instance_id,)
        )
        return [command_row(r) for r in rows]

    def command(self, command_id: str) -> dict[str, Any] | None:
        row = self._db.execute(f"SELECT {COMMAND_COLUMNS} FROM commands WHERE command_id = ?", (command_id,)).fetchone()
        return None if row is None else command_row(row)

    def pending_commands(self, instance_id: str, after_seq: int) -> list[dict[str, Any]]:
        """Commands to (re)send after a welcome: `seq > after_seq` and no terminal status yet."""
        terminal = tuple(sorted(TERMINAL_STATUSES))
        rows = self._db.execute(
            f"SELECT {COMMAND_COLUMNS} FROM commands WHERE instance_id = ? AND seq > ? "
            "AND status NOT IN (?, ?, ?) ORDER BY seq",
            (instance_id, after_seq, *terminal),
        )
        return [command_row(r) for r in rows]

    def command_updates(self, command_id: str) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT instance_id, command_id, status, result, error, received_at FROM command_updates "
            "WHERE command_id = ? ORDER BY id",
            (command_id,),
        )
        return [
            {
                "instance_id": r["instance_id"],
                "command_id": r["command_id"],
                "status": r["status"],
                "result": loads_or_none(r["result"]),
                "error": loads_or_none(r["error"]),
                "received_at": r["received_at"],
            }
            for r in rows
        ]

    # -- helpers --------------------------------------------------------------------------------

    def _tx(self) -> _Transaction:
        return _Transaction(self)

    def transaction(self) -> _Transaction:
        """Group several writes into one transaction (one COMMIT, one fsync)."""
        return _Transaction(self)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (COMMIT returns after the fsync), or ROLLBACK on error.

    Re-entrant: inside an open transaction it is a SAVEPOINT, so the group writer can run many writes
    in one transaction while a failing write still undoes only its own changes.
    """

    def __init__(self, store: Store) -> None:
        self._store = store

    def __enter__(self) -> None:
        depth = self._store._depth
        self._store._db.execute("BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT sp{depth}")
        self._store._depth = depth + 1

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._store._depth -= 1
        depth = self._store._depth
        db = self._store._db
        if depth == 0:
            db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        elif exc_type is None:
            db.execute(f"RELEASE sp{depth}")
        else:
            db.execute(f"ROLLBACK TO sp{depth}")
            db.execute(f"RELEASE sp{depth}")
