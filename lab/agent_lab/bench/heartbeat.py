"""CPU cost of one heartbeat with `activity` (PROTOCOL §2.5) for a provider tree of 50 processes.

Measured beside, in the same run: the heartbeat frame without `activity` (its cost before the tree is
read) and the other way of finding a tree that DESIGN.md names, reading `/proc/<pid>/stat` of every
process on the machine. Two tree shapes: flat (one parent, 49 children) and nested (1 + 7 + 42).
CPU time is the process's own (`time.process_time`), the best of several batches (the machine is shared).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from agent_lab.bench._common import goal, table
from driver.protocol.frames import Heartbeat, HeartbeatOutbox, encode
from driver.queue.outbox import utc_now
from driver.telemetry.activity import ActivityTracker

CALLS = 300
BATCHES = 7
GOAL_MS = 1.0

FLAT = (
    "import subprocess, sys\n"
    "ps = [subprocess.Popen(['sleep', '600']) for _ in range(49)]\n"
    "print('ok', flush=True)\n[p.wait() for p in ps]"
)
NESTED = (
    "import subprocess, sys\n"
    'kid = \'import subprocess; ps = [subprocess.Popen(["sleep", "600"]) for _ in range(6)]; [p.wait() for p in ps]\'\n'
    "ps = [subprocess.Popen([sys.executable, '-c', kid]) for _ in range(7)]\n"
    "print('ok', flush=True)\n[p.wait() for p in ps]"
)


def _tree(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def _cpu_ms(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(BATCHES):
        t0 = time.process_time()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.process_time() - t0) / CALLS * 1000)  # ms
    return best


def _frame(tracker: ActivityTracker | None) -> bytes:
    return encode(
        Heartbeat(
            at=utc_now(),
            state="running",
            run_id="run-1",
            outbox=HeartbeatOutbox(lossless_pending=0, best_effort_dropped=0),
            activity=tracker.activity() if tracker is not None else None,
        )
    )


def _scan_all() -> int:
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    f.read()
                n += 1
            except OSError:
                pass
    return n


def main() -> None:
    rows: list[tuple[str, int | str | None, float]] = []
    worst = 0.0
    for shape, code in (("flat", FLAT), ("nested", NESTED)):
        proc = _tree(code)
        try:
            tracker = ActivityTracker(lambda p=proc.pid: [p])  # type: ignore[misc]
            tracker.tool_started("call-1")
            tracker.provider_output()
            deadline = time.monotonic() + 30
            while tracker.activity().provider_processes != 50 and time.monotonic() < deadline:
                time.sleep(0.05)  # the grandchildren of the nested tree are still being spawned
            processes = tracker.activity().provider_processes
            with_activity = _cpu_ms(lambda t=tracker: _frame(t))  # type: ignore[misc]
            without = _cpu_ms(lambda: _frame(None))
            worst = max(worst, with_activity)
            rows.append((f"heartbeat with activity, {shape} tree", processes, with_activity * 1000))
            rows.append(("  baseline: the frame without activity", "", without * 1000))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    machine = _scan_all()
    rows.append(("  reference: read every /proc/<pid>/stat", machine, _cpu_ms(_scan_all) * 1000))
    table("CPU per heartbeat (µs, best of batches)", ("what", "processes", "cpu µs"), rows)
    goal("heartbeat CPU for a tree of 50", worst <= GOAL_MS, f"{worst:.3f} ms <= {GOAL_MS} ms")


if __name__ == "__main__":
    main()
