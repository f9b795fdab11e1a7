"""CPU time, RSS and process count of a process tree, read from /proc (PROTOCOL §2.5).

One sample walks the tree from its roots through `/proc/<pid>/task/<tid>/children` (every thread's
list: a child belongs to the thread that forked it, and multi-threaded runtimes fork from any thread)
and reads one `/proc/<pid>/stat` per process. The cost grows with the tree, not with the machine
(`bench/heartbeat.py` measures it).

CPU is `utime + stime + cutime + cstime` per live process: counting what a process's reaped children
used keeps the tree's sum from falling when a short-lived tool (a compiler a build starts and reaps)
exits between two samples, and a child seen alive and then reaped moves its time into its parent's
`cutime`, so nothing is counted twice. The sum can still fall when a process leaves the tree (an orphan
re-parented to init); `TreeMeter` turns samples into a counter that only grows.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# Bounds a runaway walk (a fork bomb, a cycle through a reused pid): a tree is never read past this.
MAX_PROCESSES = 4096
CHILDREN_BYTES = 65536  # a children list of thousands of pids


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


class TreeReader:
    """Reads trees, keeping each process's /proc files open between samples.

    Re-reading an open /proc file with `pread` costs less than half of opening it again (no path
    lookup), which is what keeps a heartbeat well under a millisecond of CPU for a tree of 50. An
    open descriptor stays bound to its process: once that process is gone, reading fails (ESRCH) and
    the descriptor is dropped, so a recycled pid is never mistaken for the old process. Descriptors
    are close-on-exec (Python's default), so no provider inherits them.
    """

    def __init__(self) -> None:
        self._stat: dict[int, int] = {}
        self._children: dict[tuple[int, int], int] = {}

    def _pread(self, cache: dict[Any, int], key: Any, path: str, size: int) -> bytes | None:
        fd = cache.get(key)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                return None
            cache[key] = fd
        try:
            return os.pread(fd, size, 0)
        except OSError:
            os.close(fd)
            del cache[key]
            return None

    def _stat_of(self, pid: int) -> tuple[int, int, int] | None:
        """(cpu ticks, rss pages, threads) of a live process; None if it is gone or a zombie."""
        data = self._pread(self._stat, pid, f"/proc/{pid}/stat", 4096)
        if not data:
            return None
        # The command name may contain spaces and parentheses: split after the last ')'.
        rest = data[data.rindex(b")") + 2 :].split()
        if rest[0] == b"Z":
            return None
        # Fields 14-17 (utime, stime, cutime, cstime), 20 (num_threads), 24 (rss); rest[0] is field 3.
        return int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14]), int(rest[21]), int(rest[17])

    def _children_of(self, pid: int, threads: int) -> list[int]:
        if threads == 1:
            # Most tree members (shells, tools) have one thread, whose tid is the pid: no listdir.
            tids: list[int] = [pid]
        else:
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                return []
        out: list[int] = []
        for tid in tids:
            data = self._pread(self._children, (pid, tid), f"/proc/{pid}/task/{tid}/children", CHILDREN_BYTES)
            if data:
                out.extend(map(int, data.split()))
        return out

    def sample(self, roots: list[int]) -> TreeSample:
        """Sum over `roots` and all their descendants (each process once)."""
        seen: set[int] = set()
        stack = list(roots)
        cpu = rss = n = 0
        while stack and n < MAX_PROCESSES:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            stat = self._stat_of(pid)
            if stat is None:
                continue
            cpu += stat[0]
            rss += stat[1]
            n += 1
            stack.extend(self._children_of(pid, stat[2]))
        self._forget(seen)
        return TreeSample(cpu, rss, n)

    def _forget(self, alive: set[int]) -> None:
        for pid in [p for p in self._stat if p not in alive]:
            os.close(self._stat.pop(pid))
        for key in [k for k in self._children if k[0] not in alive]:
            os.close(self._children.pop(key))

    def close(self) -> None:
        self._forget(set())

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def tree_pids(roots: list[int]) -> list[int]:
    """Every live pid of the trees under `roots`, parents before children (breadth first), at most
    MAX_PROCESSES; a one-off read without cached descriptors (the model proxy's owner lookup)."""
    out: list[int] = []
    seen: set[int] = set()
    queue = list(roots)
    while queue and len(out) < MAX_PROCESSES:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        out.append(pid)
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    queue.extend(map(int, f.read(CHILDREN_BYTES).split()))
            except (OSError, ValueError):
                continue
    return out


def sample_tree(roots: list[int]) -> TreeSample:
    """One sample with a throwaway reader (for a one-off look; repeated sampling wants a TreeReader)."""
    reader = TreeReader()
    try:
        return reader.sample(roots)
    finally:
        reader.close()


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
