"""What a `file.changed` event says about a file the agent touched: its path as reported (relative to cwd
when inside it) and its content hash. Shared by the runtimes that report file changes themselves (ACP's
`fs/write_text_file`, Claude's edit tools)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from driver.ports.files import open_admitted


def sha256_of(path: Path) -> str | None:
    """The file's sha256, or None when it does not exist (deleted) or is not a regular file."""
    try:
        # Non-blocking: a FIFO the agent left under that name must not hold a worker thread forever.
        fd = open_admitted(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def relative_to_cwd(path: Path, cwd: Path) -> str:
    """`file.changed` paths are relative to cwd; a file in memory_dir or an extra root stays absolute."""
    try:
        return path.relative_to(cwd).as_posix()
    except ValueError:
        return path.as_posix()
