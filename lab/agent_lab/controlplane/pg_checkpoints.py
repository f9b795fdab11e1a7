"""Native checkpoints (PROTOCOL §8.1) in the PostgreSQL engine: the same reassembly and checks as
`checkpoints` (SQLite), on an asyncpg connection inside the batch's transaction."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any

import asyncpg

from agent_lab.controlplane.checkpoints import CheckpointRefused


async def apply_file(db: asyncpg.Connection, instance_id: str, payload: dict[str, Any]) -> None:
    path = str(payload["path"])
    offset = int(payload["offset"])
    try:
        data = base64.b64decode(payload["data_b64"], validate=True)
    except (binascii.Error, ValueError):
        raise CheckpointRefused(f"{path}: data_b64 is not base64") from None
    row = await db.fetchrow("SELECT data FROM checkpoint_files WHERE instance_id = $1 AND path = $2", instance_id, path)
    held = b"" if row is None else bytes(row[0])
    if offset > len(held):
        raise CheckpointRefused(f"{path}: a chunk at offset {offset}, but only {len(held)} bytes are held")
    joined = held[:offset] + data
    if len(joined) > int(payload["size"]):
        raise CheckpointRefused(f"{path}: {len(joined)} bytes, more than the file's size {payload['size']}")
    await db.execute(
        "INSERT INTO checkpoint_files (instance_id, path, data) VALUES ($1, $2, $3) "
        "ON CONFLICT (instance_id, path) DO UPDATE SET data = excluded.data",
        instance_id,
        path,
        joined,
    )


async def apply_recorded(db: asyncpg.Connection, instance_id: str, payload: dict[str, Any], stamp: str) -> None:
    checkpoint_id = str(payload["checkpoint_id"])
    if await db.fetchval(
        "SELECT 1 FROM checkpoints WHERE instance_id = $1 AND checkpoint_id = $2", instance_id, checkpoint_id
    ):
        return
    total = 0
    for f in payload["files"]:
        path = str(f["path"])
        row = await db.fetchrow(
            "SELECT data FROM checkpoint_files WHERE instance_id = $1 AND path = $2", instance_id, path
        )
        if row is None:
            raise CheckpointRefused(f"{path}: no chunk of this file was stored")
        data = bytes(row[0])
        if len(data) != int(f["size"]) or hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise CheckpointRefused(f"{path}: the reassembled file does not match the manifest's size and sha256")
        await db.execute(
            "INSERT INTO checkpoint_blobs (sha256, data) VALUES ($1, $2) ON CONFLICT DO NOTHING", f["sha256"], data
        )
        total += len(data)
    files = [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]} for f in payload["files"]]
    await db.execute(
        "INSERT INTO checkpoints (instance_id, checkpoint_id, run_id, runtime, native_ref, files, bytes, recorded_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        instance_id,
        checkpoint_id,
        payload.get("run_id"),
        str(payload["runtime"]),
        str(payload["native_ref"]),
        json.dumps(files),
        total,
        stamp,
    )
