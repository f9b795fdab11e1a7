"""Phase timings of PROTOCOL §4.2 (`runtime.timing.recorded`), without I/O except one marker file.

Phases and what starts and ends their clock:
- `hello`: process start → the first `hello` frame sent (once per process);
- `provider.spawn`: process start → the driver began starting a provider (each start);
- `session.open` / `session.resume`: process start → the provider's native session is known (each
  start and each `session.reset`): `session.resume` when it is the session the start was asked to
  resume, `session.open` for a fresh one;
- `provider.ready`: process start → the provider's start finished (it takes input);
- `first_token`: the run's `run.started` → its first text (a message or thought delta, or a whole
  message when the runtime sends no deltas), each run, with `run_id`.

`mode`: `cold` for the first provider start ever made on this `state_dir` (a marker file under it
remembers), `warm` for any later one, `resume` once the start resumed a native session. `hello` is
`cold` when no provider was ever started on this `state_dir`. `first_token` carries the mode of the
start of the provider that serves the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

Mode = Literal["cold", "warm", "resume"]
FIRST_TOKEN_KINDS = frozenset({"message.delta", "thought.delta", "message.completed", "thought.completed"})


def process_start_monotonic() -> float:
    """When this process started, on the `time.monotonic()` scale (to the kernel's 10 ms tick).

    /proc/self/stat field 22 is the start in clock ticks since boot; CLOCK_BOOTTIME is now since boot."""
    try:
        with open("/proc/self/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        started_since_boot = int(rest[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started_since_boot
        return time.monotonic() - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return time.monotonic()


class Timings:
    """Collects timing records; the owner drains them (`take()`) and emits them."""

    def __init__(self, marker: Path, *, process_start: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._marker = marker
        self._t0 = process_start
        self._clock = clock
        self._cold = not marker.exists()  # no provider ever started on this state_dir
        self._hello_done = False
        self._start_mode: Mode = "cold" if self._cold else "warm"
        self._session_recorded = False
        self._resume_wanted: str | None = None
        self._run: tuple[str, float] | None = None  # the run waiting for its first token
        self._pending: list[dict[str, Any]] = []

    def _ms(self, since: float | None = None) -> float:
        return round((self._clock() - (self._t0 if since is None else since)) * 1000, 1)

    def _add(self, phase: str, ms: float, mode: Mode, run_id: str | None = None) -> None:
        record: dict[str, Any] = {"phase": phase, "ms": ms, "mode": mode}
        if run_id is not None:
            record["run_id"] = run_id
        self._pending.append(record)

    @property
    def pending(self) -> bool:
        return bool(self._pending)

    def take(self) -> list[dict[str, Any]]:
        out, self._pending = self._pending, []
        return out

    # -- phases ------------------------------------------------------------------------------------
    def hello_sent(self, at: float | None = None) -> None:
        """`at`: when it was sent (monotonic), if that was before this object existed."""
        if not self._hello_done:
            self._hello_done = True
            ms = self._ms() if at is None else round((at - self._t0) * 1000, 1)
            self._add("hello", ms, "cold" if self._cold else "warm")

    def provider_starting(self, resume_wanted: str | None) -> None:
        self._start_mode = "cold" if self._cold else "warm"
        self._session_recorded = False
        self._resume_wanted = resume_wanted
        self._add("provider.spawn", self._ms(), self._start_mode)

    def session_known(self, native_id: str | None, *, reset: bool = False) -> None:
        """The provider reported its native session (runtime.resume.updated), or a reset opened one."""
        if self._session_recorded and not reset:
            return
        self._session_recorded = True
        if not reset and native_id is not None and native_id == self._resume_wanted:
            self._start_mode = "resume"
            self._add("session.resume", self._ms(), "resume")
        else:
            self._add("session.open", self._ms(), "warm" if reset else self._start_mode)

    def provider_ready(self, native_id: str | None) -> None:
        if not self._session_recorded and native_id is not None:
            self.session_known(native_id)  # a runtime that does not announce a resumed session
        self._add("provider.ready", self._ms(), self._start_mode)
        if self._cold:
            self._cold = False
            try:
                self._marker.parent.mkdir(parents=True, exist_ok=True)
                self._marker.touch()
            except OSError:
                pass  # the next process calls its start cold again: a wrong label, not a failure

    def run_started(self, run_id: str) -> None:
        self._run = (run_id, self._clock())

    def maybe_first_token(self, kind: str) -> None:
        if self._run is not None and kind in FIRST_TOKEN_KINDS:
            run_id, started = self._run
            self._run = None
            self._add("first_token", self._ms(started), self._start_mode, run_id)

    def run_ended(self) -> None:
        self._run = None
