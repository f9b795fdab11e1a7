"""The PostgreSQL engine's tables: the same columns as SQLite's (`store_rows.SCHEMA`, `checkpoints.SCHEMA`)
so both engines' rows decode alike, plus what several gateways need: the instance's link generation
(ownership), its command counter (a row lock instead of `MAX(seq) + 1`, which two gateways would race),
and the gateway that claimed it last (for the console; nothing depends on it)."""

from __future__ import annotations

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    instance_id     TEXT PRIMARY KEY,
    highest_epoch   BIGINT NOT NULL,
    link_generation BIGINT NOT NULL DEFAULT 0,
    command_seq     BIGINT NOT NULL DEFAULT 0,
    owner           TEXT,
    terminated_at   TEXT,
    updated_at      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id          BIGSERIAL PRIMARY KEY,
    instance_id TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    epoch       BIGINT NOT NULL,
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
    seq         BIGINT NOT NULL,
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
    id          BIGSERIAL PRIMARY KEY,
    instance_id TEXT NOT NULL,
    command_id  TEXT NOT NULL,
    status      TEXT NOT NULL,
    result      TEXT,
    error       TEXT,
    received_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS command_updates_by_id ON command_updates (command_id, id);
CREATE TABLE IF NOT EXISTS checkpoint_files (
    instance_id TEXT NOT NULL,
    path        TEXT NOT NULL,
    data        BYTEA NOT NULL,
    PRIMARY KEY (instance_id, path)
);
CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    sha256 TEXT PRIMARY KEY,
    data   BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id            BIGSERIAL PRIMARY KEY,
    instance_id   TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    run_id        TEXT,
    runtime       TEXT NOT NULL,
    native_ref    TEXT NOT NULL,
    files         TEXT NOT NULL,
    bytes         BIGINT NOT NULL,
    recorded_at   TEXT NOT NULL,
    UNIQUE (instance_id, checkpoint_id)
);
"""

# Gateways starting together create the schema one at a time (CREATE ... IF NOT EXISTS still races on
# the catalog); this key is held for that one transaction only.
SCHEMA_LOCK_KEY = 0x6370_7363_6865_6D61

EVENT_INSERT = """
INSERT INTO events (instance_id, event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at,
                    payload, stored_at, digest)
SELECT $1, e.event_id, e.seq, e.epoch, e.kind, e.delivery, e.session_id, e.run_id, e.occurred_at, e.payload,
       $2, e.digest
FROM unnest($3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[],
            $11::text[], $12::text[])
     AS e(event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at, payload, digest)
ON CONFLICT (instance_id, event_id) DO NOTHING
"""

# A group of plain events in one statement and one implicit transaction (one round trip): the instance row
# is locked FOR SHARE (MATERIALIZED: the lock is taken once, before the insert, never folded away), the
# events are inserted only while the sender's link generation ($13) holds, and the statement answers with
# the generation it saw and the event ids it inserted (a duplicate is not among them).
FAST_INSERT = """
WITH held AS MATERIALIZED (
    SELECT link_generation FROM instances WHERE instance_id = $1 FOR SHARE
), ins AS (
    INSERT INTO events (instance_id, event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at,
                        payload, stored_at, digest)
    SELECT $1, e.event_id, e.seq, e.epoch, e.kind, e.delivery, e.session_id, e.run_id, e.occurred_at,
           e.payload, $2, e.digest
    FROM unnest($3::text[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[],
                $10::text[], $11::text[], $12::text[])
         AS e(event_id, seq, epoch, kind, delivery, session_id, run_id, occurred_at, payload, digest),
         held
    WHERE held.link_generation = $13
    ON CONFLICT (instance_id, event_id) DO NOTHING
    RETURNING event_id
)
SELECT (SELECT link_generation FROM held) AS held, ARRAY(SELECT event_id FROM ins) AS stored
"""

# One conditional statement claims a group of instances, in instance id order (two gateways claiming
# overlapping groups in different orders would deadlock). A claim is refused (no row returned) for a
# terminated instance or an older epoch; otherwise it takes the next link generation.
CLAIM = """
INSERT INTO instances AS i (instance_id, highest_epoch, link_generation, owner, updated_at)
SELECT c.instance_id, c.epoch, 1, $3, $4
FROM unnest($1::text[], $2::bigint[]) AS c(instance_id, epoch)
ORDER BY c.instance_id
ON CONFLICT (instance_id) DO UPDATE SET
    highest_epoch = excluded.highest_epoch,
    link_generation = i.link_generation + 1,
    owner = excluded.owner,
    updated_at = excluded.updated_at
WHERE i.terminated_at IS NULL AND i.highest_epoch <= excluded.highest_epoch
RETURNING i.instance_id, i.link_generation
"""
