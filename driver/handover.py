"""`agent-driver run --handover`: take a state_dir over from the driver process holding it (PROTOCOL §8.2).

The new process sends SIGUSR2 to the holder named in the lock file; the holder makes its journal
durable, leaves its kept provider (and the run in flight) running, and exits 0, which frees the lock;
the new process takes the lock, and its recovery reattaches to the keeper. No run is interrupted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from driver import statelock

HANDOVER_TIMEOUT_S = 60.0


def take_over(state_dir: Path, timeout: float = HANDOVER_TIMEOUT_S) -> statelock.StateLock:
    """The state_dir lock, asked of its holder if it is held. Raises StateDirLocked when the holder
    neither hands over nor exits within `timeout`."""
    asked: int | None = None
    deadline = time.monotonic() + timeout
    while True:
        try:
            return statelock.acquire(state_dir)
        except statelock.StateDirLocked as exc:
            if time.monotonic() > deadline:
                raise
            if exc.holder is not None and exc.holder != asked:
                with contextlib.suppress(ProcessLookupError):  # gone already: free on the next try
                    os.kill(exc.holder, signal.SIGUSR2)
                asked = exc.holder
            # No event tells another process's lock is released: poll the flock (cheap).
            time.sleep(0.02)
