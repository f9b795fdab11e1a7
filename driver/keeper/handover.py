"""`agent-driver run --handover`: take a state_dir over from the driver process holding it (PROTOCOL §8.2).

The new process sends SIGUSR2 to the holder named in the lock file, only when that record is the
driver's own (its MAC under the journal's key) and still names a running driver process (its start
time and command line: `statelock.verified_holder`); where the provider tree can write the file
(`containment.degraded`) the agent could otherwise name any process of the uid. The holder makes its journal
durable, leaves its kept provider (and the run in flight) running, and exits 0, which frees the lock;
the new process takes the lock, and its recovery reattaches to the keeper. No run is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from driver.containment import statelock
from driver.queue.rowmac import UNKEYED, RowMac

HANDOVER_TIMEOUT_S = 60.0
UNVERIFIED_S = 1.0  # how long a lock naming no verifiable driver is waited on (the holder writes after its flock)


class NoVerifiedHolder(statelock.StateDirLocked):
    """The lock is held, but its file names no process this one can verify as the driver."""

    def __init__(self, state_dir: Path) -> None:
        RuntimeError.__init__(
            self, f"state_dir {state_dir} is in use, and its lock names no driver process that can be verified"
        )
        self.holder = None


def take_over(state_dir: Path, timeout: float = HANDOVER_TIMEOUT_S, mac: RowMac = UNKEYED) -> statelock.StateLock:
    """The state_dir lock, asked of its holder if it is held. Raises StateDirLocked when the holder
    neither hands over nor exits within `timeout`, or when the lock names no verifiable driver."""
    asked: int | None = None
    start = time.monotonic()
    deadline = start + timeout
    while True:
        try:
            return statelock.acquire(state_dir, mac)
        except statelock.StateDirLocked as exc:
            if time.monotonic() > deadline:
                raise
            holder = statelock.verified_holder(state_dir, mac)
            if holder is None and asked is None and time.monotonic() - start > UNVERIFIED_S:
                raise NoVerifiedHolder(state_dir) from exc
            if holder is not None and holder != asked:
                with contextlib.suppress(ProcessLookupError):  # gone already: free on the next try
                    os.kill(holder, signal.SIGUSR2)
                asked = holder
            # No event tells another process's lock is released: poll the flock (cheap).
            time.sleep(0.02)
