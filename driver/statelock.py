"""One `state_dir`, one driver process (PROTOCOL §8).

The lock is an exclusive `flock` on `state_dir/driver.lock`, taken before anything else under
`state_dir` is touched (so before the journal increments the epoch) and held for the process's life:
the kernel releases it when the process dies, however it dies, so a stale lock file never blocks a
successor. The holder writes its pid into the file, for the one line a second process prints.
The descriptor is close-on-exec (Python's default), so no provider inherits it and keeps the lock alive
after its driver.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "driver.lock"


class StateDirLocked(RuntimeError):
    """Another live process holds the lock; `holder` is its pid when the file names one."""

    def __init__(self, state_dir: Path, holder: int | None) -> None:
        who = f"pid {holder}" if holder is not None else "another process"
        super().__init__(f"state_dir {state_dir} is in use by {who}")
        self.holder = holder


class StateLock:
    """A held lock. Keep the object for the process's life; `release` is for tests and clean exits."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def acquire(state_dir: Path) -> StateLock:
    """Take the lock or raise `StateDirLocked` at once (never waits)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        raise StateDirLocked(state_dir, _holder(path)) from None
    # Only the holder writes, and only after it holds the lock: the pid read by a loser is the
    # holder's (or empty in the instant between the holder's flock and this write).
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateLock(fd, path)


def _holder(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
