"""A subreaper that holds one provider and dies with the driver, taking everything the provider
started with it (driver.containment.wrapper's fallback where PID namespaces are forbidden; PROTOCOL §8).

Run as `python -I subreaper.py DRIVER_PID ARGV...` (standard library only, so `-I` is enough). It marks
itself a child subreaper (orphans of its tree, like `setsid` tools, are reparented to it instead of
to init), asks for SIGTERM when its parent thread dies (catchable, unlike SIGKILL, so it can act),
runs the provider with its own stdin/stdout/stderr, and reaps whatever exits. It ends the whole tree
(SIGKILL to every descendant) when the driver dies, or when the provider exits. A SIGTERM while the
driver lives is the group signal of a cancel: the provider got it too, and this process waits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


def kill_tree() -> None:
    """SIGKILL every descendant until none is left (orphans keep arriving as their parents die)."""
    while kids := descendants(os.getpid()):
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    driver, command = int(argv[0]), argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)

    def on_term(signum: int, frame: object) -> None:
        if os.getppid() != driver:  # the driver is gone: so is everything we hold
            kill_tree()
            os._exit(128 + signal.SIGKILL)

    signal.signal(signal.SIGTERM, on_term)
    if os.getppid() != driver:  # the driver died before the death signal was armed
        return 128 + signal.SIGKILL
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        finally:
            os._exit(127)
    status = 0
    while True:
        try:
            reaped, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if reaped == pid:
            status = os.waitstatus_to_exitcode(code)
            break
    kill_tree()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
