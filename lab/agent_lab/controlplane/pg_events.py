"""Storing a group of event batches on PostgreSQL, only while the link generation that sent them holds.

Two paths, one rule (the instance row is read `FOR SHARE` in the same transaction as the insert, so a
takeover waits for a batch in flight and a batch behind a committed takeover stores nothing):
- the common one, a group of plain events: ONE statement (`FAST_INSERT`) in its own implicit
  transaction, checking the generation, inserting with `ON CONFLICT DO NOTHING` and committing in one
  round trip. A group that carries a duplicate asks for the stored digests after that commit (a
  stored event never changes, so reading it later is as good).
- a group with a checkpoint or a `command.finished`: one explicit transaction, statement by statement,
  since those events write other tables (a refused checkpoint is rolled back to its savepoint).

Either way the caller resolves the batches' futures after the COMMIT (`synchronous_commit = on`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import asyncpg

from agent_lab.controlplane import pg_checkpoints
from agent_lab.controlplane.checkpoints import CheckpointRefused
from agent_lab.controlplane.pg_schema import EVENT_INSERT, FAST_INSERT
from agent_lab.controlplane.store_rows import BatchResult, StoredRejection, Superseded, now_iso
from agent_lab.controlplane.validation import ValidEvent
from driver.protocol.frames import TERMINAL_STATUSES

Batch = tuple[Sequence[ValidEvent], Sequence[StoredRejection]]
_TERMINAL = sorted(TERMINAL_STATUSES)


def _plain(group: Sequence[Batch]) -> bool:
    """No event of the group writes a table other than `events`."""
    return not any(ev.kind.startswith("checkpoint.") or ev.kind == "command.finished" for evs, _ in group for ev in evs)


async def store_group(
    pool: asyncpg.Pool, instance_id: str, generation: int, group: Sequence[Batch]
) -> list[BatchResult]:
    """Store `group` (the batches one link generation sent) and say, per batch, what was stored."""
    if _plain(group):
        return await _store_plain(pool, instance_id, generation, group)
    async with pool.acquire() as conn, conn.transaction():
        return await _store_in_transaction(conn, instance_id, generation, group)


async def _store_plain(
    pool: asyncpg.Pool, instance_id: str, generation: int, group: Sequence[Batch]
) -> list[BatchResult]:
    stamp = now_iso()
    first: dict[str, ValidEvent] = {}
    for events, _ in group:
        for ev in events:
            first.setdefault(ev.event_id, ev)
    async with pool.acquire() as conn:
        row = await conn.fetchrow(FAST_INSERT, instance_id, stamp, *_columns(list(first.values())), generation)
        if row is None or row["held"] != generation:
            raise Superseded(f"link generation {generation} of {instance_id} no longer holds")
        inserted = set(row["stored"])
        known: dict[str, str] = {}
        if len(inserted) < len(first):  # some were stored before: are they the same event?
            rows = await conn.fetch(
                "SELECT event_id, digest FROM events WHERE instance_id = $1 AND event_id = ANY($2::text[])",
                instance_id,
                [i for i in first if i not in inserted],
            )
            known = {r[0]: r[1] for r in rows}
    results: list[BatchResult] = []
    for events, rejected in group:
        result = BatchResult(accepted=[], rejected=list(rejected), stored=[], stored_at=stamp)
        new: list[str] = []
        for ev in events:
            if ev.event_id in inserted and first[ev.event_id] is ev:
                result.stored.append(ev)
                new.append(ev.event_id)
                continue
            digest = known.get(ev.event_id) or first[ev.event_id].digest
            if digest == ev.digest:
                result.accepted.append(ev.event_id)
            else:
                result.rejected.append(conflict(ev.event_id))
        result.accepted.extend(new)
        results.append(result)
    return results


async def _store_in_transaction(
    conn: asyncpg.Connection, instance_id: str, generation: int, group: Sequence[Batch]
) -> list[BatchResult]:
    stamp = now_iso()
    held = await conn.fetchval("SELECT link_generation FROM instances WHERE instance_id = $1 FOR SHARE", instance_id)
    if held != generation:
        raise Superseded(f"link generation {generation} of {instance_id} no longer holds")
    ids = list({ev.event_id for events, _ in group for ev in events})
    known: dict[str, str] = {}
    if ids:
        rows = await conn.fetch(
            "SELECT event_id, digest FROM events WHERE instance_id = $1 AND event_id = ANY($2::text[])",
            instance_id,
            ids,
        )
        known = {r[0]: r[1] for r in rows}
    fresh: list[ValidEvent] = []
    results: list[BatchResult] = []
    for events, rejected in group:
        result = BatchResult(accepted=[], rejected=list(rejected), stored=[], stored_at=stamp)
        new: list[str] = []
        for ev in events:
            digest = known.get(ev.event_id)
            if digest is not None:
                if digest == ev.digest:
                    result.accepted.append(ev.event_id)
                else:
                    result.rejected.append(conflict(ev.event_id))
                continue
            refused = await _apply_checkpoint(conn, instance_id, ev, stamp)
            if refused is not None:
                result.rejected.append(refused)
                continue
            known[ev.event_id] = ev.digest
            fresh.append(ev)
            result.stored.append(ev)
            new.append(ev.event_id)
        result.accepted.extend(new)
        results.append(result)
    if fresh:
        await conn.execute(EVENT_INSERT, instance_id, stamp, *_columns(fresh))
    for ev in fresh:
        if ev.kind == "command.finished":
            payload = json.loads(ev.payload_json)
            res, err = payload.get("result"), payload.get("error")
            await apply_update(
                conn,
                instance_id,
                str(payload["command_id"]),
                str(payload["status"]),
                None if res is None else json.dumps(res),
                None if err is None else json.dumps(err),
                stamp,
            )
    return results


async def _apply_checkpoint(
    conn: asyncpg.Connection, instance_id: str, ev: ValidEvent, stamp: str
) -> StoredRejection | None:
    if not ev.kind.startswith("checkpoint."):
        return None
    try:
        async with conn.transaction():  # a savepoint: a refused event leaves nothing behind
            payload = json.loads(ev.payload_json)
            if ev.kind == "checkpoint.file":
                await pg_checkpoints.apply_file(conn, instance_id, payload)
            else:
                await pg_checkpoints.apply_recorded(conn, instance_id, payload, stamp)
    except CheckpointRefused as exc:
        return StoredRejection(event_id=ev.event_id, code="checkpoint.incomplete", message=str(exc), retryable=False)
    return None


async def apply_update(
    conn: asyncpg.Connection,
    instance_id: str,
    command_id: str,
    status: str,
    result_json: str | None,
    error_json: str | None,
    stamp: str,
) -> bool:
    """Record a command's status update; the command's own status moves unless it already ended."""
    await conn.execute(
        "INSERT INTO command_updates (instance_id, command_id, status, result, error, received_at) "
        "VALUES ($1, $2, $3, $4, $5, $6)",
        instance_id,
        command_id,
        status,
        result_json,
        error_json,
        stamp,
    )
    done = await conn.execute(
        "UPDATE commands SET status = $1, result = $2, error = $3, updated_at = $4 "
        "WHERE command_id = $5 AND instance_id = $6 AND status <> ALL($7::text[])",
        status,
        result_json,
        error_json,
        stamp,
        command_id,
        instance_id,
        _TERMINAL,
    )
    return bool(done == "UPDATE 1")


def conflict(event_id: str) -> StoredRejection:
    return StoredRejection(
        event_id=event_id,
        code="event.conflict",
        message="an event with this event_id and different content is already stored",
        retryable=False,
    )


def _columns(events: Sequence[ValidEvent]) -> list[list[Any]]:
    return [
        [ev.event_id for ev in events],
        [ev.seq for ev in events],
        [ev.epoch for ev in events],
        [ev.kind for ev in events],
        [ev.delivery for ev in events],
        [ev.session_id for ev in events],
        [ev.run_id for ev in events],
        [ev.occurred_at for ev in events],
        [ev.payload_json for ev in events],
        [ev.digest for ev in events],
    ]
