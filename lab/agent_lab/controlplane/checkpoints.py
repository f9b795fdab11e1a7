"""The reference control plane's native checkpoints (PROTOCOL §8.1), in its SQLite store.

`checkpoint.file` chunks are reassembled per instance and path as they are stored (a chunk at `offset`
keeps the first `offset` bytes already held and appends its data, so a resent chunk overwrites itself;
a gap is refused). `checkpoint.recorded` is checked against what was reassembled: every file of the
manifest must have its size and sha256. A complete checkpoint keeps its files as content-addressed
blobs (one copy of a file that did not change), so the latest complete checkpoint of an instance can be
served to a new one; an incomplete one is rejected (`checkpoint.incomplete`, not retryable), which
makes the driver send whole files next time.

Called by `Store.insert_events` inside its transaction: the receipt of a checkpoint means its files are
stored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoint_files (
    instance_id TEXT NOT NULL,
    path        TEXT NOT NULL,
    data        BLOB NOT NULL,
    PRIMARY KEY (instance_id, path)
);
CREATE TABLE IF NOT EXISTS checkpoint_blobs (
    sha256 TEXT PRIMARY KEY,
    data   BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    instance_id   TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    run_id        TEXT,
    runtime       TEXT NOT NULL,
    native_ref    TEXT NOT NULL,
    files         TEXT NOT NULL,
    bytes         INTEGER NOT NULL,
    recorded_at   TEXT NOT NULL,
    UNIQUE (instance_id, checkpoint_id)
);
"""


class CheckpointRefused(ValueError):
    """A checkpoint event that cannot be stored: the message says why (it becomes a rejection)."""


def apply_file(db: sqlite3.Connection, instance_id: str, payload: dict[str, Any]) -> None:
    path = str(payload["path"])
    offset = int(payload["offset"])
    try:
        data = base64.b64decode(payload["data_b64"], validate=True)
    except (binascii.Error, ValueError):
        raise CheckpointRefused(f"{path}: data_b64 is not base64") from None
    row = db.execute(
        "SELECT data FROM checkpoint_files WHERE instance_id = ? AND path = ?", (instance_id, path)
    ).fetchone()
    held = b"" if row is None else bytes(row[0])
    if offset > len(held):
        raise CheckpointRefused(f"{path}: a chunk at offset {offset}, but only {len(held)} bytes are held")
    joined = held[:offset] + data
    if len(joined) > int(payload["size"]):
        raise CheckpointRefused(f"{path}: {len(joined)} bytes, more than the file's size {payload['size']}")
    db.execute(
        "INSERT INTO checkpoint_files (instance_id, path, data) VALUES (?, ?, ?) "
        "ON CONFLICT (instance_id, path) DO UPDATE SET data = excluded.data",
        (instance_id, path, joined),
    )


def apply_recorded(db: sqlite3.Connection, instance_id: str, payload: dict[str, Any], stamp: str) -> None:
    checkpoint_id = str(payload["checkpoint_id"])
    if db.execute(
        "SELECT 1 FROM checkpoints WHERE instance_id = ? AND checkpoint_id = ?", (instance_id, checkpoint_id)
    ).fetchone():
        return
    total = 0
    for f in payload["files"]:
        path = str(f["path"])
        row = db.execute(
            "SELECT data FROM checkpoint_files WHERE instance_id = ? AND path = ?", (instance_id, path)
        ).fetchone()
        if row is None:
            raise CheckpointRefused(f"{path}: no chunk of this file was stored")
        data = bytes(row[0])
        if len(data) != int(f["size"]) or hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise CheckpointRefused(f"{path}: the reassembled file does not match the manifest's size and sha256")
        db.execute("INSERT OR IGNORE INTO checkpoint_blobs (sha256, data) VALUES (?, ?)", (f["sha256"], data))
        total += len(data)
    files = [{"path": f["path"], "size": f["size"], "sha256": f["sha256"]} for f in payload["files"]]
    db.execute(
        "INSERT INTO checkpoints (instance_id, checkpoint_id, run_id, runtime, native_ref, files, bytes, recorded_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            instance_id,
            checkpoint_id,
            payload.get("run_id"),
            str(payload["runtime"]),
            str(payload["native_ref"]),
            json.dumps(files),
            total,
            stamp,
        ),
    )


def _row(r: sqlite3.Row) -> dict[str, Any]:
    return {
        "instance_id": r["instance_id"],
        "checkpoint_id": r["checkpoint_id"],
        "run_id": r["run_id"],
        "runtime": r["runtime"],
        "native_ref": r["native_ref"],
        "files": json.loads(r["files"]),
        "bytes": r["bytes"],
        "recorded_at": r["recorded_at"],
    }


_COLUMNS = "instance_id, checkpoint_id, run_id, runtime, native_ref, files, bytes, recorded_at"


def listing(db: sqlite3.Connection, instance_id: str) -> list[dict[str, Any]]:
    """The instance's complete checkpoints, oldest first."""
    rows = db.execute(f"SELECT {_COLUMNS} FROM checkpoints WHERE instance_id = ? ORDER BY id", (instance_id,))
    return [_row(r) for r in rows]


def latest(db: sqlite3.Connection, instance_id: str) -> dict[str, Any] | None:
    r = db.execute(
        f"SELECT {_COLUMNS} FROM checkpoints WHERE instance_id = ? ORDER BY id DESC LIMIT 1", (instance_id,)
    ).fetchone()
    return None if r is None else _row(r)


def blob(db: sqlite3.Connection, sha256: str) -> bytes | None:
    r = db.execute("SELECT data FROM checkpoint_blobs WHERE sha256 = ?", (sha256,)).fetchone()
    return None if r is None else bytes(r[0])


def native_checkpoint(
    checkpoint: dict[str, Any], folder: Path, get_blob: Callable[[str], bytes | None]
) -> dict[str, Any]:
    """`execution.native_checkpoint` for a new sandbox: the checkpoint's files written (mode 0600, named
    by their sha256) into `folder` and named by `file:` URLs. ValueError when a file is missing."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    files = []
    for f in checkpoint["files"]:
        data = get_blob(f["sha256"])
        if data is None or hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise ValueError(f"checkpoint {checkpoint['checkpoint_id']}: file {f['path']} is not stored")
        target = folder / f["sha256"]
        if not target.exists():
            fd = os.open(target.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(target.with_suffix(".tmp"), target)
        files.append({"path": f["path"], "url": target.resolve().as_uri(), "size": f["size"], "sha256": f["sha256"]})
    return {"runtime": checkpoint["runtime"], "native_ref": checkpoint["native_ref"], "files": files}
