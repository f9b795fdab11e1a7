"""Read-only queries the console needs beyond `Store`'s: events in store order by row id, and instances.

A connection of its own, opened read-only on the event loop thread: in WAL mode it sees every
committed write without blocking the writer thread.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

_EVENT_COLUMNS = "id, event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at, payload, stored_at"


class ConsoleQueries:
    def __init__(self, db_path: Path) -> None:
        self._db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA busy_timeout = 5000")

    def close(self) -> None:
        self._db.close()

    def events_after(self, instance_id: str, after_row: int, limit: int) -> list[dict[str, Any]]:
        """Stored events in the order they were stored (`row` is the cursor a stream resumes from)."""
        rows = self._db.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE instance_id = ? AND id > ? ORDER BY id LIMIT ?",
            (instance_id, after_row, limit),
        )
        return [
            {
                "row": r["id"],
                "event_id": r["event_id"],
                "seq": r["seq"],
                "epoch": r["epoch"],
                "kind": r["kind"],
                "delivery": r["delivery"],
                "session_id": r["session_id"],
                "run_id": r["run_id"],
                "occurred_at": r["occurred_at"],
                "payload": json.loads(r["payload"]),
                "stored_at": r["stored_at"],
            }
            for r in rows
        ]

    def event(self, instance_id: str, event_id: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT kind, payload FROM events WHERE instance_id = ? AND event_id = ?", (instance_id, event_id)
        ).fetchone()
        return None if row is None else {"kind": row["kind"], "payload": json.loads(row["payload"])}

    def instances(self) -> list[dict[str, Any]]:
        """Every instance that ever completed a handshake, the most recently seen first."""
        rows = self._db.execute(
            "SELECT instance_id, highest_epoch, terminated_at FROM instances ORDER BY updated_at DESC"
        )
        return [dict(r) for r in rows]

    def latest_payload(self, instance_id: str, kind: str) -> dict[str, Any] | None:
        row = self._db.execute(
            "SELECT payload FROM events WHERE instance_id = ? AND kind = ? ORDER BY id DESC LIMIT 1",
            (instance_id, kind),
        ).fetchone()
        return None if row is None else dict(json.loads(row["payload"]))

    def count_diagnostics(self, instance_id: str, code: str) -> int:
        row = self._db.execute(
            "SELECT COUNT(*) FROM events WHERE instance_id = ? AND kind = 'diagnostic.reported' "
            "AND json_extract(payload, '$.code') = ?",
            (instance_id, code),
        ).fetchone()
        return int(row[0])
