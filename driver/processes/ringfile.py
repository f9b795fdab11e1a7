"""A process's output ring on disk: `state_dir/driver/processes/<hash>.ring`, the newest 1 MiB of its
output at position `offset % 1 MiB` (see `ring`), then 8 bytes: the output's length so far. Beside it
`<hash>.json` names the process while it runs. Under `state_dir/driver/`, so hidden from the provider
tree (PROTOCOL §9).

A driver that dies leaves both: the next one reads them (`leftovers`) to end each such process with
its `process.exited` (it died with the driver, by SIGKILL), then empties the folder."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import struct
from pathlib import Path
from typing import NamedTuple

import msgspec

from driver.processes.ring import RING_BYTES, oldest_kept, pieces
from driver.processes.text import TAIL_BYTES

FOLDER = "processes"


def folder(state_dir: Path) -> Path:
    return state_dir / "driver" / FOLDER


def reset_folder(state_dir: Path) -> Path:
    path = folder(state_dir)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


class Leftover(NamedTuple):
    """A process a dead driver process left running (it died with that driver)."""

    process_id: str
    output_bytes: int
    tail: bytes  # the last 4 KiB the ring holds
    cut: bool  # whether the tail was cut from a longer output


class _Record(msgspec.Struct):
    process_id: str
    pid: int


def leftovers(root: Path) -> list[Leftover]:
    """What the folder says ran when the previous driver process died (nothing it cannot read)."""
    found: list[Leftover] = []
    if not root.is_dir():
        return found
    for record_path in sorted(root.glob("*.json")):
        try:
            record = msgspec.json.decode(record_path.read_bytes(), type=_Record)
            ring = RingFile.reopen(record_path.with_suffix(".ring"))
        except (OSError, msgspec.DecodeError, ValueError):
            continue
        start = max(0, ring.total - TAIL_BYTES)
        found.append(Leftover(record.process_id, ring.total, ring.read(start, ring.total), start > 0))
        ring.close()
    return found


TRAILER = struct.Struct("<Q")


class RingFile:
    def __init__(
        self, root: Path, process_id: str, generation: int, capacity: int = RING_BYTES, *, pid: int | None = None
    ) -> None:
        # Hashed: the id is the control plane's, the file name is ours.
        name = hashlib.sha256(f"{process_id}\0{generation}".encode()).hexdigest()[:32]
        self.path = root / f"{name}.ring"
        self.record = self.path.with_suffix(".json")
        self.capacity = capacity
        self.total = 0  # bytes written since the process started: the next byte's offset
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        os.pwrite(self._fd, TRAILER.pack(0), capacity)  # a sparse file of capacity + 8 bytes from the start
        if pid is not None:
            self._write_record(process_id, pid)

    @classmethod
    def reopen(cls, path: Path) -> RingFile:
        """A ring a previous driver process wrote (read only)."""
        ring = cls.__new__(cls)
        ring.path, ring.record = path, path.with_suffix(".json")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        size = os.fstat(fd).st_size
        if size < TRAILER.size:
            os.close(fd)
            raise ValueError("a ring without its length")
        ring._fd, ring.capacity = fd, size - TRAILER.size
        (ring.total,) = TRAILER.unpack(os.pread(fd, TRAILER.size, ring.capacity))
        return ring

    def _write_record(self, process_id: str, pid: int) -> None:
        tmp = self.record.with_suffix(".tmp")
        tmp.write_bytes(msgspec.json.encode(_Record(process_id, pid)))
        tmp.chmod(0o600)
        tmp.replace(self.record)

    def ended(self) -> None:
        """The process's process.exited is admitted: nothing is left for a successor to end."""
        with contextlib.suppress(FileNotFoundError):
            self.record.unlink()

    def append(self, data: bytes) -> int:
        """Keep `data` (its newest `capacity` bytes); return the offset of its first byte."""
        offset = self.total
        self.total += len(data)
        if self._fd is None:
            return offset
        keep = data[-self.capacity :] if len(data) > self.capacity else data
        at = offset + len(data) - len(keep)
        done = 0
        for piece in pieces(at, len(keep), self.capacity):
            os.pwrite(self._fd, keep[done : done + piece.length], piece.position)
            done += piece.length
        # The length, after the data, at a fixed place: a successor reads it if this driver dies.
        os.pwrite(self._fd, TRAILER.pack(self.total), self.capacity)
        return offset

    def read(self, start: int, end: int) -> bytes:
        """The bytes at [start, end), clipped to what the ring still holds."""
        start = max(start, oldest_kept(self.total, self.capacity))
        end = min(end, self.total)
        if self._fd is None or end <= start:
            return b""
        return b"".join(os.pread(self._fd, p.length, p.position) for p in pieces(start, end - start, self.capacity))

    def close(self, *, remove: bool = False) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            for path in (self.path, self.record):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
