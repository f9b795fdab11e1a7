"""The store's tables and records: the SQLite schema (PostgreSQL's is in `pg_schema`), the records its
writes return (a batch's result, an epoch verdict), and rows decoded into the dicts its reads return.
No connection here: that is `store`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import msgspec

from agent_lab.controlplane.validation import ValidEvent

PENDING = "pending"

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    instance_id     TEXT PRIMARY KEY,
    highest_epoch   INTEGER NOT NULL,
    terminated_at   TEXT,
    updated_at      TEXT NOT NULL,
    link_generation INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    id          INTEGER PRIMARY KEY,
    instance_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    epoch       INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    delivery    TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    run_id      TEXT,
    occurred_at TEXT NOT NULL,
    payload     TEXT NOT NULL,
    digest      TEXT NOT NULL,
    stored_at   TEXT NOT NULL,
    UNIQUE (instance_id, event_id)
);
CREATE INDEX IF NOT EXISTS events_by_seq ON events (instance_id, seq);
CREATE TABLE IF NOT EXISTS commands (
    instance_id TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    command_id  TEXT NOT NULL UNIQUE,
    kind        TEXT NOT NULL,
    body        TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    PRIMARY KEY (instance_id, seq)
);
CREATE TABLE IF NOT EXISTS command_updates (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id TEXT NOT NULL,
    command_id  TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    received_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS command_updates_by_id ON command_updates (command_id, id);
"""

_decode = msgspec.json.Decoder().decode

EVENT_COLUMNS = "instance_id, event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at, payload, stored_at"
COMMAND_COLUMNS = "instance_id, seq, command_id, kind, body, status, result, error, created_at, updated_at"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class StoredRejection(msgspec.Struct, frozen=True, kw_only=True):
    event_id: str
    code: str
    message: str
    retryable: bool


class BatchResult(msgspec.Struct, kw_only=True):
    accepted: list[str]
    rejected: list[StoredRejection]
    stored: list[ValidEvent]  # only the events new to the store, for live subscribers
    stored_at: str = ""

    def stored_items(self, instance_id: str) -> list[dict[str, Any]]:
        """The new events as the live items subscribers get (built only when someone listens)."""
        return [
            {
                "type": "event",
                "instance_id": instance_id,
                "event_id": ev.event_id,
                "seq": ev.seq,
                "epoch": ev.epoch,
                "kind": ev.kind,
                "delivery": ev.delivery,
                "session_id": ev.session_id,
                "run_id": ev.run_id,
                "occurred_at": ev.occurred_at,
                "payload": _decode(ev.payload_json),
                "stored_at": self.stored_at,
            }
            for ev in self.stored
        ]


class EpochVerdict(msgspec.Struct, frozen=True):
    """A claim's answer: allowed or not, the highest epoch seen, and (when allowed) the link generation
    the claim took: the instance's batches are stored only while that generation holds."""

    allowed: bool
    highest: int
    terminated: bool = False
    generation: int = 0


class Superseded(RuntimeError):
    """A batch whose link generation no longer holds: a newer link claimed the instance (close 4409)."""


class CommandExists(ValueError):
    pass


def loads_or_none(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def event_row(row: Any) -> dict[str, Any]:
    return {
        "instance_id": row["instance_id"],
        "event_id": row["event_id"],
        "seq": row["seq"],
        "epoch": row["epoch"],
        "kind": row["kind"],
        "delivery": row["delivery"],
        "session_id": row["session_id"],
        "run_id": row["run_id"],
        "occurred_at": row["occurred_at"],
        "payload": json.loads(row["payload"]),
        "stored_at": row["stored_at"],
    }


def command_row(row: Any) -> dict[str, Any]:
    return {
        "instance_id": row["instance_id"],
        "seq": row["seq"],
        "command_id": row["command_id"],
        "kind": row["kind"],
        "body": json.loads(row["body"]),
        "status": row["status"],
        "result": loads_or_none(row["result"]),
        "error": loads_or_none(row["error"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
