"""Which process of the provider tree holds the client end of a loopback TCP connection (PROTOCOL §6.7).

From the kernel's tables, no cooperation asked of the client: the connection's client port names a
row of `/proc/net/tcp` (or `tcp6`, for a dual-stack socket) whose local end is that port and whose
remote end is the listener's; the row gives the socket's inode; the process holding it has a
`/proc/<pid>/fd/N` link reading `socket:[<inode>]`. Only the given tree's pids are searched (the
provider tree, walked from its roots as `proctree` does), parents before children, so a socket a
child inherited is given to the parent that made it. Blocking reads of /proc: call it off the event
loop.

The process's start time (`/proc/<pid>/stat` field 22, clock ticks since boot) is read with it: it is
what attribution compares with the runs' start times (`boot_seconds()` is the same clock).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from driver.telemetry.proctree import CLOCK_TICKS_PER_S, tree_pids

TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# A table is read at most this far (a machine with tens of thousands of sockets): the row is not
# found past it, and the caller keeps its default.
MAX_TABLE_BYTES = 8 * 1024 * 1024
MAX_FDS = 4096  # per process searched


@dataclass(frozen=True, slots=True)
class Owner:
    """The process holding a connection's client socket."""

    pid: int
    started_s: float  # seconds since boot (CLOCK_BOOTTIME), at the kernel's tick resolution


def boot_seconds() -> float:
    """Now, on the clock /proc start times are counted on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def socket_inode(client_port: int, server_port: int) -> int | None:
    """The inode of the socket whose local port is `client_port` and remote port `server_port`."""
    local = f":{client_port:04X}"
    remote = f":{server_port:04X}"
    for table in TCP_TABLES:
        try:
            with open(table, "rb") as f:
                data = f.read(MAX_TABLE_BYTES)
        except OSError:
            continue
        for line in data.decode("ascii", "replace").splitlines()[1:]:
            cols = line.split()
            # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if len(cols) > 9 and cols[1].endswith(local) and cols[2].endswith(remote):
                inode = int(cols[9]) if cols[9].isdigit() else 0
                if inode:
                    return inode
    return None


def holder(inode: int, pids: list[int]) -> int | None:
    """The first of `pids` with a descriptor on socket `inode`."""
    wanted = f"socket:[{inode}]"
    for pid in pids:
        folder = f"/proc/{pid}/fd"
        try:
            names = os.listdir(folder)
        except OSError:
            continue  # gone, or not ours to read
        for name in names[:MAX_FDS]:
            try:
                if os.readlink(f"{folder}/{name}") == wanted:
                    return pid
            except OSError:
                continue
    return None


def started_s(pid: int) -> float | None:
    """A process's start, in seconds since boot; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read(4096)
        # The command name may hold spaces and parentheses: fields counted after the last ')'.
        return int(data[data.rindex(b")") + 2 :].split()[19]) / CLOCK_TICKS_PER_S
    except (OSError, ValueError, IndexError):
        return None


def find_owner(client_port: int, server_port: int, roots: list[int]) -> Owner | None:
    """The tree process holding the client end of `client_port` → `server_port`; None when not found
    (the client is outside the tree, closed already, or a race lost it)."""
    if not roots:
        return None
    inode = socket_inode(client_port, server_port)
    if inode is None:
        return None
    pid = holder(inode, tree_pids(roots))
    if pid is None:
        return None
    start = started_s(pid)
    return Owner(pid, start) if start is not None else None
