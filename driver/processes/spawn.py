"""Start one process beside the agent, inside the provider's containment (PROTOCOL §6.8, §8).

The argv is `containment.wrap`ped like a provider's (bwrap's PID namespace tied to the driver, or the
subreaper), so the process and whatever it starts die with the driver. Inside, `env --default-signal`
gives the command default dispositions back: the namespace's shell starts it as an asynchronous
command, which ignores SIGINT, and an interactive shell could then never be interrupted by Ctrl-C.

A PTY: the slave is the process's stdin, stdout and stderr, and `setsid --ctty` (util-linux), run
inside the containment, makes it the controlling terminal of a new session there: job control,
`stty size` and SIGWINCH work, and a shell finds its terminal's process groups in its own PID
namespace (a session led from outside it leaves a shell unable to give the terminal back at exit). Pipes:
stdin a pipe, stdout and stderr one pipe (one stream of output, in the order it was written).
Spawned on the event loop's thread (the PDEATHSIG of the wrapper follows the forking thread).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import termios
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from driver import containment
from driver.adapters.common.environment import child_env


class Spawned(NamedTuple):
    proc: subprocess.Popen[bytes]
    read_fd: int  # the output: the PTY's master, or the stdout+stderr pipe
    write_fd: int  # the input: the PTY's master (the same fd), or the stdin pipe


class SpawnError(OSError):
    pass


def set_winsize(fd: int, cols: int, rows: int) -> None:
    """TIOCSWINSZ: the kernel sends SIGWINCH to the terminal's foreground process group."""
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _ctty_prefix() -> list[str]:
    setsid = shutil.which("setsid")
    if setsid is None:
        raise SpawnError("setsid (util-linux) is needed to give a process its terminal")
    return [setsid, "--wait", "--ctty"]  # --wait: where it must fork, it still reports the exit


def spawn(
    argv: list[str], env: Mapping[str, str], cwd: Path, pty: tuple[int, int] | None, wrapped_prefix: list[str]
) -> Spawned:
    """Start `argv`; `wrapped_prefix` is `containment.prefix()` (already probed, off the loop)."""
    env_bin = shutil.which("env") or "/usr/bin/env"
    inner = [env_bin, "--default-signal", *argv]
    if pty is None:
        proc = subprocess.Popen(
            [*wrapped_prefix, *inner],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env(env),
            cwd=cwd,
            start_new_session=True,  # its own group: process.signal reaches it and not the driver
        )
        assert proc.stdin is not None and proc.stdout is not None
        read_fd, write_fd = proc.stdout.fileno(), proc.stdin.fileno()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        return Spawned(proc, read_fd, write_fd)
    cols, rows = pty
    master, slave = os.openpty()
    try:
        set_winsize(slave, cols, rows)
        proc = subprocess.Popen(
            [*wrapped_prefix, *_ctty_prefix(), *inner],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=child_env(env),
            cwd=cwd,
            start_new_session=True,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    return Spawned(proc, master, master)


async def prefix() -> list[str]:
    return await containment.wrap_async([])
