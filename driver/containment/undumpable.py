"""Keep the driver's memory away from processes of its own uid (issue 11, the credential boundary).

The agent's tools run as the driver's uid; without this, any of them can read the control token out
of `/proc/<driver>/mem` or `environ`, or ptrace-attach. `PR_SET_DUMPABLE 0` makes the kernel refuse
all three to anything lacking CAP_SYS_PTRACE (and makes the process's /proc files root-owned). It
must run before the boot payload is read. It is not inherited across execve, so provider processes
are unaffected.
"""

from __future__ import annotations

import ctypes

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def _libc() -> ctypes.CDLL:
    # The running interpreter's own symbols, libc's among them: `ctypes.util.find_library` would
    # spawn `ldconfig -p` / scan the library paths, milliseconds of every driver's start.
    return ctypes.CDLL(None, use_errno=True)


def make_undumpable() -> None:
    """Raise OSError if the kernel refuses: a driver that cannot protect its token must not start."""
    libc = _libc()
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, "prctl(PR_SET_DUMPABLE, 0) failed")


def is_dumpable() -> bool:
    return bool(_libc().prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
