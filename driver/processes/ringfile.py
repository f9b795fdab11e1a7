"""A process's output ring on disk: `state_dir/driver/processes/<hash>.ring`, the newest 1 MiB of its
output (see `ring`), and beside it `<hash>.json` naming the process while it runs. Under
`state_dir/driver/`, so hidden from the provider tree (PROTOCOL §9), and authenticated for where it is
not (`containment.degraded`: the agent's tools could rewrite it, and `process.replay` would send it).

The file is cut in blocks of 4 KiB; block k holds the output's bytes [k·4096, (k+1)·4096) at slot
k mod S, where S = capacity / 4096 + 1 (one slot more than the capacity, so the newest `capacity` bytes
never share a slot with a block that is being refilled). After the slots: one HMAC-SHA256 per slot
(under the journal's key, driver/queue/rowmac.py) over the ring's name, k, the block's length and its
bytes; then the trailer: capacity and length so far, with their MAC. The block being filled is kept in
memory too, so each append rewrites and re-MACs it whole from the driver's own copy (never from the
file). Every read checks the MAC of each block it returns: a block the driver did not write fails
(`RingTampered`), and nothing of it is sent. An older copy of the whole file (a rollback) only shows
a prefix of the real output: its blocks are the driver's own.

A driver that dies leaves both files: the next one reads them (`leftovers`: each record's MAC and the
ring's checked) to end each such process with its `process.exited` (it died with the driver, by
SIGKILL), then empties the folder."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import shutil
import struct
from pathlib import Path
from typing import NamedTuple

import msgspec

from driver import agent_files
from driver.processes.ring import RING_BYTES, oldest_kept
from driver.processes.text import TAIL_BYTES
from driver.queue.rowmac import MAC_BYTES, UNKEYED, RowMac

FOLDER = "processes"


def folder(state_dir: Path) -> Path:
    return state_dir / "driver" / FOLDER


def reset_folder(state_dir: Path) -> Path:
    path = folder(state_dir)
    shutil.rmtree(path, ignore_errors=True)
    # What rmtree leaves is not a folder (containment.degraded: the agent can make it a file, a fifo
    # or a link): removed, not followed, or the mkdir below failed every later start.
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


BLOCK = 4096
TRAILER = struct.Struct("<QQ")  # capacity, total


class RingTampered(Exception):
    """A block or the trailer of a ring failed its check: the driver did not write it."""


class Leftover(NamedTuple):
    """A process a dead driver process left running (it died with that driver)."""

    process_id: str
    output_bytes: int
    tail: bytes  # the last 4 KiB the ring holds
    cut: bool  # whether the tail was cut from a longer output


class _Record(msgspec.Struct):
    process_id: str
    pid: int
    mac: str = ""


def _record_mac(mac: RowMac, name: str, process_id: str, pid: int) -> str:
    return mac.of("process_record", name, process_id, pid).hex()


def leftovers(root: Path, mac: RowMac = UNKEYED) -> list[Leftover]:
    """What the folder says ran when the previous driver process died: only records and rings the
    driver wrote (a record or ring that fails its check is reported, `journal.tampered`, and skipped)."""
    from driver import containment

    found: list[Leftover] = []
    if not root.is_dir():
        return found
    for record_path in sorted(root.glob("*.json")):
        try:
            # Bounded, no link followed, a fifo refused (containment.degraded: the agent's to shape).
            raw = agent_files.read_file(root, record_path.name, max_bytes=64 * 1024)
            record = msgspec.json.decode(raw, type=_Record)
        except (agent_files.AgentFileError, OSError, msgspec.DecodeError, ValueError):
            containment.report("process_rings", record_path.name, "mac")
            continue
        good = _record_mac(mac, record_path.stem, record.process_id, record.pid)
        if not hmac.compare_digest(record.mac, good):
            containment.report("process_rings", record_path.name, "mac")
            continue
        try:
            ring = RingFile.reopen(record_path.with_suffix(".ring"), mac)
            start = max(0, ring.total - TAIL_BYTES)
            tail = ring.read(start, ring.total)
        except (OSError, ValueError, RingTampered):
            containment.report("process_rings", record_path.with_suffix(".ring").name, "mac")
            continue
        found.append(Leftover(record.process_id, ring.total, tail, start > 0))
        ring.close()
    return found


class RingFile:
    def __init__(
        self,
        root: Path,
        process_id: str,
        generation: int,
        capacity: int = RING_BYTES,
        *,
        pid: int | None = None,
        mac: RowMac = UNKEYED,
    ) -> None:
        # Hashed: the id is the control plane's, the file name is ours.
        self.name = hashlib.sha256(f"{process_id}\0{generation}".encode()).hexdigest()[:32]
        self.path = root / f"{self.name}.ring"
        self.record = self.path.with_suffix(".json")
        self._setup(capacity, mac)
        self.total = 0  # bytes written since the process started: the next byte's offset
        self._partial = b""  # the bytes of the block being filled (the driver's own copy)
        # A fresh file, never one that stands there (a link or fifo the agent planted, where degraded).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self._fd: int | None = os.open(self.path, flags, 0o600)
        self._write_trailer()  # a sparse file of its whole size from the start
        if pid is not None:
            self._write_record(process_id, pid)

    def _setup(self, capacity: int, mac: RowMac) -> None:
        self.block = min(BLOCK, capacity)
        if capacity <= 0 or capacity % self.block:
            raise ValueError("a ring's capacity is a positive multiple of its block")
        self.capacity = capacity
        self.slots = capacity // self.block + 1
        self._macs_at = self.slots * self.block
        self._trailer_at = self._macs_at + self.slots * MAC_BYTES
        self._mac = mac

    @classmethod
    def reopen(cls, path: Path, mac: RowMac = UNKEYED) -> RingFile:
        """A ring a previous driver process wrote (read only); `RingTampered` when its trailer fails."""
        ring = cls.__new__(cls)
        ring.name = path.stem
        ring.path, ring.record = path, path.with_suffix(".json")
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            size = os.fstat(fd).st_size
            end = TRAILER.size + MAC_BYTES
            if size < end:
                raise ValueError("a ring without its trailer")
            raw = os.pread(fd, end, size - end)
            capacity, total = TRAILER.unpack(raw[: TRAILER.size])
            if not mac.check(raw[TRAILER.size :], "ring_trailer", ring.name, capacity, total):
                raise RingTampered(f"{path.name}: its trailer")
            ring._setup(capacity, mac)
            if size != ring._trailer_at + end:
                raise RingTampered(f"{path.name}: its size")
        except BaseException:
            os.close(fd)
            raise
        ring._fd, ring.total, ring._partial = fd, total, b""
        return ring

    def _write_record(self, process_id: str, pid: int) -> None:
        mac = _record_mac(self._mac, self.name, process_id, pid)
        agent_files.write_file(self.record.parent, self.record.name, msgspec.json.encode(_Record(process_id, pid, mac)))

    def _write_trailer(self) -> None:
        assert self._fd is not None
        mac = self._mac.of("ring_trailer", self.name, self.capacity, self.total)
        os.pwrite(self._fd, TRAILER.pack(self.capacity, self.total) + mac, self._trailer_at)

    def _block_mac(self, k: int, data: bytes) -> bytes:
        return self._mac.of("ring", self.name, k, len(data), data)

    def ended(self) -> None:
        """The process's process.exited is admitted: nothing is left for a successor to end."""
        with contextlib.suppress(FileNotFoundError):
            self.record.unlink()

    def append(self, data: bytes) -> int:
        """Keep `data` (its newest `capacity` bytes at least); return the offset of its first byte."""
        offset = self.total
        end = offset + len(data)
        self.total = end
        if self._fd is None or not data:
            return offset
        b = self.block
        # From the start of the block holding the oldest byte kept: S slots hold capacity + one block.
        keep_from = max(offset, (max(0, end - self.capacity) // b) * b)
        for k in range(keep_from // b, (end - 1) // b + 1):
            start, stop = k * b, min((k + 1) * b, end)
            # The block being filled starts before `offset`: the driver's own copy, then the new bytes.
            content = self._partial + data[: stop - offset] if start < offset else data[start - offset : stop - offset]
            slot = k % self.slots
            os.pwrite(self._fd, content, slot * b)
            os.pwrite(self._fd, self._block_mac(k, content), self._macs_at + slot * MAC_BYTES)
            self._partial = content if len(content) < b else b""
        # The length, at a fixed place: a successor reads it if this driver dies.
        self._write_trailer()
        return offset

    def read(self, start: int, end: int) -> bytes:
        """The bytes at [start, end), clipped to the newest `capacity` the ring holds; each block
        checked (`RingTampered` when one is not the driver's)."""
        start = max(start, oldest_kept(self.total, self.capacity))
        end = min(end, self.total)
        if self._fd is None or end <= start:
            return b""
        b = self.block
        out: list[bytes] = []
        for k in range(start // b, (end - 1) // b + 1):
            first, stop = k * b, min((k + 1) * b, self.total)
            slot = k % self.slots
            content = os.pread(self._fd, stop - first, slot * b)
            mac = os.pread(self._fd, MAC_BYTES, self._macs_at + slot * MAC_BYTES)
            if not self._mac.check(mac, "ring", self.name, k, len(content), content) or len(content) != stop - first:
                raise RingTampered(f"{self.path.name}: block {k}")
            out.append(content[max(start, first) - first : min(end, stop) - first])
        return b"".join(out)

    def close(self, *, remove: bool = False) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            for path in (self.path, self.record):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
