"""Attachments as the kernel leaves them for an adapter: downloaded into cwd/inputs/."""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path

from driver.protocol.commands import Attachment


def png(width: int = 2, height: int = 2) -> bytes:
    """A valid, tiny RGB PNG (runtimes decode images before sending them)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\0" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def place(cwd: Path, name: str, data: bytes) -> Attachment:
    """Put `data` at cwd/inputs/<name> (as the kernel's download does) and describe it."""
    (cwd / "inputs").mkdir(parents=True, exist_ok=True)
    (cwd / "inputs" / name).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    return Attachment(name=name, url=(cwd / "inputs" / name).as_uri(), sha256=digest, size=len(data))
