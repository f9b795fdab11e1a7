"""A process's output ring on disk: `state_dir/driver/processes/<hash>.ring`, the newest 1 MiB of its
output at position `offset % 1 MiB` (see `ring`). Under `state_dir/driver/`, so hidden from the
provider tree (PROTOCOL §9); a new driver process empties the folder (its processes died with the
previous one)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from driver.processes.ring import RING_BYTES, oldest_kept, pieces

FOLDER = "processes"


def folder(state_dir: Path) -> Path:
    return state_dir / "driver" / FOLDER


def reset_folder(state_dir: Path) -> Path:
    path = folder(state_dir)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


class RingFile:
    def __init__(self, root: Path, process_id: str, generation: int, capacity: int = RING_BYTES) -> None:
        # Hashed: the id is the control plane's, the file name is ours.
        name = hashlib.sha256(f"{process_id}\0{generation}".encode()).hexdigest()[:32]
        self.path = root / f"{name}.ring"
        self.capacity = capacity
        self.total = 0  # bytes written since the process started: the next byte's offset
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

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
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
