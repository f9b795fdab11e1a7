"""Reading a native session's files for a checkpoint without trusting their sizes (PROTOCOL §8.1, §9).

The session's folder is the agent's: a sparse 64 MiB file costs it no disk, and a plain `read()` of six
of them would put 384 MiB in the driver. So nothing is read before everything was measured:

- `survey` opens each listed file below the provider's home without following a link (the folder walk
  of `driver.agent_files`), refuses anything but a regular file (a fifo, a device, a link), and sums the
  sizes `fstat` gives against the checkpoint budget. Over the budget, nothing has been read.
- `digest` then reads each file in bounded pieces, at most the size surveyed (so at most the budget in
  all, never a whole file at once): its sha256, the sha256 of the prefix a previous checkpoint sent,
  and whether a credential of the execution appears in it.
- `pieces` reads the bytes to send, again in bounded pieces, and the caller checks at the end that
  they hash as `digest` said (a file changed between the passes fails the checkpoint, never sends a
  manifest that does not match what was sent).

Every problem raises `CheckpointError` naming the file; nothing here may end the daemon.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.agent_files import AgentFileError, open_folder
from driver.checkpoints import chunks

READ_BYTES = 1024 * 1024  # one read of a session file: the most of it in memory at once while hashing


class CheckpointError(Exception):
    pass


class TooLarge(CheckpointError):
    """The files' sizes sum past the budget (nothing was read)."""

    def __init__(self, total: int, limit: int) -> None:
        super().__init__(f"the native session's files are {total} bytes, over the {limit}-byte limit")
        self.total = total
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Found:
    rel: str
    size: int  # from fstat, before anything was read: the most that is ever read of this file


@dataclass(frozen=True, slots=True)
class Facts:
    rel: str
    size: int
    sha256: str
    offset: int | None  # where its chunks start (None: unchanged since the last checkpoint)
    leaked: bool  # a credential of the execution is written in it
    prefix: Any  # the sha256 state after `offset` bytes: the send pass continues it to check the bytes


def open_file(home: Path, rel: str) -> int:
    """A read descriptor of the regular file `home/rel`, every component opened without following a
    link, `O_NONBLOCK` so that a fifo cannot hold the open."""
    folder, _, name = rel.rpartition("/")
    try:
        dir_fd = open_folder(home, folder)
    except AgentFileError as exc:
        raise CheckpointError(str(exc)) from None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError as exc:
        raise CheckpointError(f"{rel}: {exc.strerror or exc}") from None
    finally:
        os.close(dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{rel}: not a regular file")
    return fd


def survey(home: Path, names: list[str]) -> list[Found]:
    """Each file's size, measured before any byte is read; `TooLarge` when they sum past the budget."""
    limit = chunks.MAX_CHECKPOINT_BYTES
    found: list[Found] = []
    for rel in names:
        fd = open_file(home, rel)
        try:
            found.append(Found(rel, os.fstat(fd).st_size))
        finally:
            os.close(fd)
    total = sum(f.size for f in found)
    if total > limit:
        raise TooLarge(total, limit)
    return found


def read_pieces(fd: int, rel: str, start: int, end: int, step: int) -> Iterator[bytes]:
    at = start
    while at < end:
        piece = os.pread(fd, min(step, end - at), at)
        if not piece:
            raise CheckpointError(f"{rel}: changed while it was read (shorter than its size)")
        yield piece
        at += len(piece)


class _Scan:
    """Whether any of `secrets` occurs in a stream read in pieces (an overlap keeps a secret cut in two)."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = [s for s in secrets if s]
        self.keep = max((len(s) for s in self.secrets), default=1) - 1
        self.tail = b""
        self.found = False

    def feed(self, piece: bytes) -> bool:
        if self.secrets and not self.found:
            window = self.tail + piece
            self.found = any(s in window for s in self.secrets)
            self.tail = window[-self.keep :] if self.keep else b""
        return self.found


def digest(home: Path, found: Found, sent: chunks.Sent | None, secrets: list[bytes]) -> Facts:
    """One pass over the file's first `found.size` bytes, in bounded pieces."""
    fd = open_file(home, found.rel)
    try:
        whole = hashlib.sha256()
        prefix_at = sent.size if sent is not None and sent.size <= found.size else None
        prefix = whole.copy() if prefix_at == 0 else None
        scan = _Scan(secrets)
        at = 0
        for piece in read_pieces(fd, found.rel, 0, found.size, READ_BYTES):
            if prefix_at is not None and at < prefix_at < at + len(piece):
                whole.update(piece[: prefix_at - at])
                prefix = whole.copy()
                whole.update(piece[prefix_at - at :])
            else:
                whole.update(piece)
            at += len(piece)
            if prefix_at is not None and at == prefix_at:
                prefix = whole.copy()
            scan.feed(piece)
    finally:
        os.close(fd)
    offset: int | None = 0
    start_state = hashlib.sha256()
    if sent is not None and prefix is not None and prefix.hexdigest() == sent.sha256:
        offset = None if sent.size == found.size else sent.size
        start_state = prefix
    return Facts(found.rel, found.size, whole.hexdigest(), offset, scan.found, start_state)


class Pieces:
    """The bytes of one file from its chunks' offset to its surveyed size, `step` at a time; `check()`
    after the last says whether they hash as the digest pass found (and hold no credential)."""

    def __init__(self, home: Path, facts: Facts, step: int, secrets: list[bytes]) -> None:
        self.facts = facts
        self._fd = open_file(home, facts.rel)
        self._hash = facts.prefix.copy()
        self._scan = _Scan(secrets)
        start = facts.offset or 0
        self._iter = read_pieces(self._fd, facts.rel, start, facts.size, step)

    def next(self) -> bytes | None:
        """The next piece, or None after the last."""
        piece = next(self._iter, None)
        if piece is not None:
            self._hash.update(piece)
            if self._scan.feed(piece):
                raise CheckpointError(f"{self.facts.rel}: a credential was written in it while it was read")
        return piece

    def check(self) -> None:
        if self._hash.hexdigest() != self.facts.sha256:
            raise CheckpointError(f"{self.facts.rel}: changed while it was read")

    def close(self) -> None:
        os.close(self._fd)
