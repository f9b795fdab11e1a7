"""A checkpoint as events (PROTOCOL §8.1): which bytes of each file to send, cut into `checkpoint.file`
payloads that each fit `max_event_bytes`, and the `checkpoint.recorded` manifest. Pure: no I/O.

Incremental: the driver remembers, per file, how many bytes it sent and the sha256 of those bytes. A
file whose first `sent` bytes still hash the same only grew (the runtimes append to their JSONL), so
only its bytes from `offset = sent` go; any other change sends the whole file from offset 0. An
unchanged file sends no chunk; a file never sent sends at least one (maybe empty) chunk, so the
control plane knows it.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024  # PROTOCOL §8.1: per session per checkpoint
FORMAT = 1


@dataclass(frozen=True)
class Sent:
    """What was sent of one file: its first `size` bytes, whose sha256 is `sha256`."""

    size: int
    sha256: str


class ChunkTooSmall(ValueError):
    """`max_event_bytes` leaves no room for data beside a chunk's other fields."""


def sha256_hex(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def resume_offset(data: bytes, sent: Sent | None) -> int | None:
    """Where this file's chunks start; None when nothing of it needs sending."""
    if sent is None:
        return 0
    if sent.size <= len(data) and sha256_hex(memoryview(data)[: sent.size]) == sent.sha256:
        return None if sent.size == len(data) else sent.size
    return 0


def _overhead(checkpoint_id: str, path: str, size: int, digest: str, offset: int) -> int:
    return len(msgspec.json.encode(_payload(checkpoint_id, path, offset, "", size, digest)))


def _payload(checkpoint_id: str, path: str, offset: int, data_b64: str, size: int, digest: str) -> dict[str, Any]:
    return {
        "checkpoint_id": checkpoint_id,
        "path": path,
        "offset": offset,
        "data_b64": data_b64,
        "size": size,
        "sha256": digest,
    }


def chunk_step(checkpoint_id: str, path: str, size: int, digest: str, limit: int) -> int:
    """How many bytes of data one `checkpoint.file` payload of this file carries within `limit` (base64
    has no JSON escapes, so the size is exact: never cut by §4.3, which would corrupt the file)."""
    # The widest offset any chunk carries sizes the room left for data.
    room = limit - _overhead(checkpoint_id, path, size, digest, size)
    step = (room // 4) * 3
    if step <= 0:
        raise ChunkTooSmall(f"max_event_bytes {limit} leaves no room for data of {path!r}")
    return step


def chunk_payload(checkpoint_id: str, path: str, offset: int, piece: bytes, size: int, digest: str) -> dict[str, Any]:
    return _payload(checkpoint_id, path, offset, base64.b64encode(piece).decode("ascii"), size, digest)


def file_chunks(checkpoint_id: str, path: str, data: bytes, offset: int, limit: int) -> list[dict[str, Any]]:
    """`checkpoint.file` payloads for `data[offset:]`, each encoding to at most `limit` bytes."""
    size, digest = len(data), sha256_hex(data)
    step = chunk_step(checkpoint_id, path, size, digest, limit)
    out = []
    at = offset
    while True:
        piece = data[at : at + step]
        out.append(chunk_payload(checkpoint_id, path, at, piece, size, digest))
        at += len(piece)
        if at >= size:
            return out


def manifest(
    checkpoint_id: str, run_id: str | None, runtime: str, native_ref: str, files: dict[str, bytes]
) -> dict[str, Any]:
    entries = [(p, len(d), sha256_hex(d)) for p, d in files.items()]
    return manifest_of(checkpoint_id, run_id, runtime, native_ref, entries)


def manifest_of(
    checkpoint_id: str, run_id: str | None, runtime: str, native_ref: str, files: list[tuple[str, int, str]]
) -> dict[str, Any]:
    """The `checkpoint.recorded` body from each file's (path, size, sha256)."""
    return {
        "checkpoint_id": checkpoint_id,
        "run_id": run_id,
        "runtime": runtime,
        "native_ref": native_ref,
        "format": FORMAT,
        "files": [{"path": p, "size": n, "sha256": h} for p, n, h in sorted(files)],
    }


def encode_sent(ref: str, sent: dict[str, Sent]) -> str:
    return msgspec.json.encode(
        {"native_ref": ref, "files": {p: {"size": s.size, "sha256": s.sha256} for p, s in sent.items()}}
    ).decode()


def decode_sent(text: str | None, ref: str) -> dict[str, Sent]:
    """The sent state of session `ref` (empty for another session, or an unreadable state: then whole
    files are sent again, which is always correct)."""
    if not text:
        return {}
    try:
        raw = msgspec.json.decode(text)
        if raw.get("native_ref") != ref:
            return {}
        return {str(p): Sent(int(v["size"]), str(v["sha256"])) for p, v in raw["files"].items()}
    except (msgspec.DecodeError, AttributeError, KeyError, TypeError, ValueError):
        return {}
