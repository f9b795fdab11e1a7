"""What a `file.changed` event says about a file the agent touched: its path as reported (relative to cwd
when inside it) and its content hash. Shared by the runtimes that report file changes themselves (ACP's
`fs/write_text_file`, Claude's edit tools)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from driver.ports.files import open_admitted

# A file.changed hash is taken of files up to this size; a larger one is reported with sha256 null.
# The agent's sparse 1 TiB file costs it no disk, and hashing it held a worker thread (and through
# it the run, its cancel and the link's other threaded work) for many minutes.
MAX_HASH_BYTES = 256 * 1024 * 1024


def sha256_of(path: Path) -> str | None:
    """The file's sha256, or None when it does not exist (deleted), is not a regular file or is larger
    than MAX_HASH_BYTES (from fstat, before a byte is read)."""
    try:
        # Non-blocking: a FIFO the agent left under that name must not hold a worker thread forever.
        fd = open_admitted(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return bounded_sha256(fh)


def bounded_sha256(fh: BinaryIO) -> str | None:
    """The sha256 of the open regular file `fh`, at most MAX_HASH_BYTES of it; None when it is not a
    regular file or larger (a file grown since the fstat is cut off at the bound: None too)."""
    st = os.fstat(fh.fileno())
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_HASH_BYTES:
        return None
    digest = hashlib.sha256()
    left = MAX_HASH_BYTES + 1
    while left > 0 and (chunk := fh.read(min(1 << 20, left))):
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest() if left > 0 else None


def relative_to_cwd(path: Path, cwd: Path) -> str:
    """`file.changed` paths are relative to cwd; a file in memory_dir or an extra root stays absolute."""
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        return path.as_posix()
