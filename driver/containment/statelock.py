"""One `state_dir`, one driver process (PROTOCOL §8).

The lock is an exclusive `flock` on `state_dir/driver.lock`, taken before anything else under
`state_dir` is touched (so before the journal increments the epoch) and held for the process's life:
the kernel releases it when the process dies, however it dies, so a stale lock file never blocks a
successor. The holder writes its pid into the file, for the one line a second process prints, with its start time
and a MAC under the journal's key (driver/queue/rowmac.py): where the provider tree can write the file
(`containment.degraded`), `--handover` signals only a holder whose record is the driver's own and still
names that very process (driver/keeper/handover.py).
The descriptor is close-on-exec (Python's default), so no provider inherits it and keeps the lock alive
after its driver.
"""

from __future__ import annotations

import errno
import fcntl
import hmac
import os
from pathlib import Path

from driver.queue.rowmac import UNKEYED, RowMac

LOCK_NAME = "driver.lock"
_MAX_BYTES = 256  # the record is one short line: nothing longer is read from a file the agent may write


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


def _mac_of(mac: RowMac, pid: int, start: int) -> str:
    return mac.of("statelock", pid, start).hex()


def acquire(state_dir: Path, mac: RowMac = UNKEYED) -> StateLock:
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
    from driver.containment.record import start_time

    pid = os.getpid()
    start = start_time(pid) or 0
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{pid} {start} {_mac_of(mac, pid, start)}\n".encode(), 0)
    return StateLock(fd, path)


def _fields(path: Path) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        return os.read(fd, _MAX_BYTES).decode(errors="replace").split()
    except OSError:
        return []
    finally:
        os.close(fd)


def _holder(path: Path) -> int | None:
    """The pid the file names, for the message only: never signalled unless `verified_holder` says so."""
    fields = _fields(path)
    return int(fields[0]) if fields and fields[0].isdigit() else None


def verified_holder(state_dir: Path, mac: RowMac) -> int | None:
    """The holder's pid when the lock file is the driver's own (its MAC checks) and names a process that
    is still that one (the same start time) and runs the driver (`driver.cli run`); else None."""
    from driver.containment.record import start_time

    fields = _fields(state_dir / LOCK_NAME)
    if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    pid, start = int(fields[0]), int(fields[1])
    if pid <= 1 or not hmac.compare_digest(fields[2], _mac_of(mac, pid, start)):
        return None
    if start_time(pid) != start:
        return None  # that driver is gone and its pid reused (or it never was this one)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()[:4096].split(b"\0")
    except OSError:
        return None
    return pid if b"run" in argv and any(a == b"driver.cli" or a.endswith(b"agent-driver") for a in argv) else None
