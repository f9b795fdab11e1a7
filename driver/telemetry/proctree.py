"""CPU time, RSS and process count of a process tree, read from /proc (PROTOCOL §2.5).

One sample walks the tree from its roots through `/proc/<pid>/task/<tid>/children` (every thread's
list: a child belongs to the thread that forked it, and multi-threaded runtimes fork from any thread)
and reads one `/proc/<pid>/stat` per process. The cost grows with the tree, not with the machine.

CPU is `utime + stime + cutime + cstime` per live process: counting what a process's reaped children
used keeps the tree's sum from falling when a short-lived tool (a compiler a build starts and reaps)
exits between two samples, and a child seen alive and then reaped moves its time into its parent's
`cutime`, so nothing is counted twice. The sum can still fall when a process leaves the tree (an orphan
re-parented to init); `TreeMeter` turns samples into a counter that only grows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# Bounds a runaway walk (a fork bomb, a cycle through a reused pid): a tree is never read past this.
MAX_PROCESSES = 4096


@dataclass(frozen=True, slots=True)
class TreeSample:
    cpu_ticks: int  # summed utime + stime + cutime + cstime of the live processes
    rss_pages: int
    processes: int

    @property
    def cpu_ms(self) -> float:
        return self.cpu_ticks * 1000.0 / CLOCK_TICKS_PER_S

    @property
    def rss_mb(self) -> float:
        return self.rss_pages * PAGE_BYTES / (1024 * 1024)


EMPTY = TreeSample(0, 0, 0)


def _read(path: str) -> bytes | None:
    """One small /proc file with raw syscalls: several times cheaper than `open()`'s file object,
    which is what keeps a heartbeat under a millisecond for a tree of 50."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(cpu ticks, rss pages, threads) of a live process; None if it is gone or a zombie."""
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    # The command name may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    if rest[0] == b"Z":
        return None
    # Fields 14-17 (utime, stime, cutime, cstime), 20 (num_threads) and 24 (rss); rest[0] is field 3.
    return int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]), int(rest[21]), int(rest[17])


def _children(pid: int, threads: int) -> list[int]:
    if threads == 1:
        # Most tree members (shells, tools) have one thread, whose tid is the pid: no listdir needed.
        data = _read(f"/proc/{pid}/task/{pid}/children")
        return list(map(int, data.split())) if data else []
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        data = _read(f"/proc/{pid}/task/{tid}/children")
        if data:
            out.extend(map(int, data.split()))
    return out


def sample_tree(roots: list[int]) -> TreeSample:
    """Sum over `roots` and all their descendants (each process once)."""
    seen: set[int] = set()
    stack = list(roots)
    cpu = rss = n = 0
    while stack and n < MAX_PROCESSES:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        stat = _stat(pid)
        if stat is None:
            continue
        cpu += stat[0]
        rss += stat[1]
        n += 1
        stack.extend(_children(pid, stat[2]))
    return TreeSample(cpu, rss, n)


class TreeMeter:
    """Samples of one provider's tree turned into a CPU counter that never goes down.

    `cpu_ticks` grows by every positive step of the tree's sum; a step down (a process left the tree
    with its time) is absorbed, so the counter measures work done, which is what liveness asks."""

    def __init__(self) -> None:
        self.cpu_ticks = 0
        self._last_sum: int | None = None
        self.last = EMPTY

    def update(self, sample: TreeSample) -> TreeSample:
        if self._last_sum is not None and sample.cpu_ticks > self._last_sum:
            self.cpu_ticks += sample.cpu_ticks - self._last_sum
        elif self._last_sum is None:
            self.cpu_ticks = sample.cpu_ticks
        self._last_sum = sample.cpu_ticks
        self.last = sample
        return sample

    @property
    def cpu_ms(self) -> float:
        return self.cpu_ticks * 1000.0 / CLOCK_TICKS_PER_S
