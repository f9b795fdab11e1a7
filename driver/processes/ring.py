"""The arithmetic of a process's output ring (PROTOCOL §6.8), free of I/O.

A process's output is one stream of raw bytes; offset N is its Nth byte since the process started.
The ring keeps the newest `capacity` bytes at file position `offset % capacity`, so a write or a read
of a range of offsets is at most two contiguous pieces of the file.
"""

from __future__ import annotations

from typing import NamedTuple

RING_BYTES = 1024 * 1024  # the newest 1 MiB of each process's output


class Piece(NamedTuple):
    position: int  # in the ring file
    length: int


def pieces(offset: int, length: int, capacity: int = RING_BYTES) -> list[Piece]:
    """Where the bytes at [offset, offset + length) sit in the ring (length <= capacity)."""
    if length <= 0:
        return []
    if length > capacity:
        raise ValueError("a range longer than the ring")
    start = offset % capacity
    first = min(length, capacity - start)
    out = [Piece(start, first)]
    if first < length:
        out.append(Piece(0, length - first))
    return out


def oldest_kept(total: int, capacity: int = RING_BYTES) -> int:
    """The offset of the oldest byte the ring still holds, after `total` bytes were written."""
    return max(0, total - capacity)


class ReplayPlan(NamedTuple):
    start: int  # the first offset resent
    end: int  # one past the last (the output's length when the replay was asked)
    truncated_before: bool  # older bytes than asked for are gone


def plan_replay(from_offset: int, total: int, capacity: int = RING_BYTES) -> ReplayPlan:
    """What a `process.replay{from_offset}` resends. `from_offset` past the output is refused by the
    caller (a console cannot have seen bytes that were never produced)."""
    oldest = oldest_kept(total, capacity)
    start = max(from_offset, oldest)
    return ReplayPlan(start, total, from_offset < oldest)


def chunk_ranges(start: int, end: int, max_bytes: int) -> list[tuple[int, int]]:
    """[start, end) cut into ranges of at most `max_bytes` (the events of a replay)."""
    out = []
    at = start
    while at < end:
        nxt = min(end, at + max_bytes)
        out.append((at, nxt))
        at = nxt
    return out
