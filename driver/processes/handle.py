"""The I/O of one running process beside the agent: reading what its output holds now, waiting for its
exit (a pidfd), signalling it, closing its descriptors, and the checks before a spawn."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import pwd
import shutil
import struct
import termios
from pathlib import Path

import anyio

from driver import containment
from driver.processes.spawn import Spawned

TIOCGSID = getattr(termios, "TIOCGSID", 0x5429)  # the Linux value; not in every termios stub


def read_available(fd: int, limit: int) -> tuple[bytes, bool]:
    """What can be read now, up to `limit` bytes (several reads: one event for a burst); and
    whether the output ended (EOF on a pipe, EIO on a PTY whose other side is closed)."""
    parts: list[bytes] = []
    got = 0
    while got < limit:
        try:
            chunk = os.read(fd, limit - got)
        except BlockingIOError:
            return b"".join(parts), False
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.EBADF):
                return b"".join(parts), True
            raise
        if not chunk:
            return b"".join(parts), True
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts), False


async def wait_exit(spawned: Spawned) -> int:
    proc = spawned.proc
    code = proc.poll()
    if code is not None:
        return code
    pidfd = os.pidfd_open(proc.pid)
    try:
        while (code := proc.poll()) is None:
            await anyio.wait_readable(pidfd)
    finally:
        anyio.notify_closing(pidfd)
        os.close(pidfd)
    return code


def send_signal(spawned: Spawned, sig: int, *, pty: bool) -> None:
    """To the process's group (the wrapper's: `kill_group` reaches a PID namespace as a whole on KILL)
    and, for a terminal, to its foreground group too (an interactive shell moves jobs into their own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        containment.kill_group(spawned.proc.pid, sig)
    if pty:
        # The command leads its terminal's session (inside the containment): signal it, and the
        # terminal's foreground group (a job an interactive shell started).
        fd = spawned.read_fd
        with contextlib.suppress(OSError):
            leader = struct.unpack("i", fcntl.ioctl(fd, TIOCGSID, b"\0" * 4))[0]
            if leader > 0:
                os.kill(leader, sig)
        with contextlib.suppress(OSError):
            fg = os.tcgetpgrp(fd)
            if fg > 0:
                os.killpg(fg, sig)


def close_fds(spawned: Spawned) -> None:
    for fd in {spawned.read_fd, spawned.write_fd}:
        anyio.notify_closing(fd)  # wakes a reader or writer still waiting on it
    proc = spawned.proc
    if proc.stdout is None:  # a PTY: the master is ours
        with contextlib.suppress(OSError):
            os.close(spawned.read_fd)
        return
    # Pipes: the Popen's file objects own the fds.
    for f in (proc.stdin, proc.stdout):
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()


def account_shell() -> str | None:
    try:
        return pwd.getpwuid(os.getuid()).pw_shell or None
    except KeyError:
        return None


def executable(name: str, path: str | None, cwd: Path) -> str | None:
    if "/" in name:
        target = Path(name) if os.path.isabs(name) else cwd / name
        return str(target) if os.access(target, os.X_OK) and target.is_file() else None
    return shutil.which(name, path=path or os.defpath)
