"""The journal's SQLite schema, its migrations and bounds, and the little parsing its writes need."""

from __future__ import annotations

import msgspec

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY,
    event_id TEXT NOT NULL UNIQUE,
    run_id TEXT,
    kind TEXT NOT NULL,
    body BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS commands (
    command_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    status TEXT NOT NULL,
    update_frame BLOB,
    touched INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS commands_touched ON commands(touched);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    command_id TEXT NOT NULL,
    started_at TEXT NOT NULL,
    terminal TEXT,
    error TEXT
);
CREATE TABLE IF NOT EXISTS texts (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS transcript (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    role TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS set_aside (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    key TEXT NOT NULL,
    reason TEXT NOT NULL,
    row BLOB
);
"""
# Columns added after the first release: (table, column, declaration), applied when missing.
MIGRATIONS = (
    ("runs", "terminal", "TEXT"),
    ("runs", "error", "TEXT"),
    ("commands", "kind", "TEXT"),
    # Journal rows are authenticated (PROTOCOL §9, driver/queue/rowmac.py): a row without a MAC (an
    # older driver's, or one an agent inserted) never passes the check.
    ("meta", "mac", "BLOB"),
    ("outbox", "mac", "BLOB"),
    ("commands", "mac", "BLOB"),
    ("runs", "mac", "BLOB"),
    ("texts", "mac", "BLOB"),
    ("transcript", "mac", "BLOB"),
    ("runs", "derived", "INTEGER NOT NULL DEFAULT 0"),
)
# Set-aside rows kept for an operator to look at, at most this many (the oldest go first).
SET_ASIDE_KEPT = 10_000
# Pruned command seqs above the contiguous pruned prefix, as (first, last) ranges, at most this many
# (beyond it the highest ranges are forgotten: `last_command_seq` then under-claims, never over-claims).
PRUNED_RANGES_KEPT = 1024

RUN_TERMINAL_KINDS = frozenset({"run.completed", "run.failed", "run.cancelled"})
# The lossless run events an adapter derives from the provider's output alone, counted per run in the
# transaction that journals them: a driver that reattaches to a kept provider re-derives its run's
# events from the output log and suppresses the first `derived` of them (driver/keeper/reattach.py).
DERIVED_KINDS = frozenset(
    {
        "message.started",
        "message.completed",
        "thought.started",
        "thought.completed",
        "tool.started",
        "tool.completed",
        "file.changed",
        "plan.updated",
        "usage.updated",
    }
)
# Seqs are reserved in blocks so best-effort events (never journaled) still get seqs that no later
# process reuses, without a write per event.
SEQ_BLOCK = 65536
# PROTOCOL §3: at least the last 1024 terminal statuses are kept.
COMMANDS_KEPT = 4096
# Ended runs are kept (so a restart can mirror a terminal into its command's status) up to this many.
RUNS_KEPT = 1024
# PROTOCOL §8: the transcript kept for replay is bounded to its newest 64 KiB of text.
TRANSCRIPT_MAX_BYTES = 64 * 1024


def terminal_error(body: bytes) -> str | None:
    """The `error` of a journaled `run.failed` body, as JSON (None for other terminals)."""
    try:
        payload = msgspec.json.decode(body).get("payload") or {}
    except (msgspec.DecodeError, AttributeError):
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    return msgspec.json.encode(error).decode() if isinstance(error, dict) else None
