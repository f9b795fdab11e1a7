"""Provider supervision policy, without I/O: the crash-loop window, restart backoff, and the bounds
the kernel's cancellation and supervision use, readable from the environment.

The kernel restarts a provider that crashed (mid-run or while idle). Restarting a provider that
crashes again at once would burn the sandbox's CPU and hide the fault, so restarts back off, and
once `limit` crashes fall within `window_s` the loop is declared: inputs then fail fast with the
retryable `provider.crash_loop` until the next successful start. A successful start clears the
declaration but keeps the history, so a provider that starts and then crashes again re-trips at once.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping

Clock = Callable[[], float]

CRASH_LOOP_LIMIT = 5
CRASH_LOOP_WINDOW_S = 600.0
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_CAP_S = 30.0


class CrashWindow:
    """Crashes in a sliding window; the backoff before the next restart; the crash-loop flag."""

    def __init__(
        self,
        *,
        limit: int = CRASH_LOOP_LIMIT,
        window_s: float = CRASH_LOOP_WINDOW_S,
        backoff_base_s: float = RESTART_BACKOFF_BASE_S,
        backoff_cap_s: float = RESTART_BACKOFF_CAP_S,
        clock: Clock = time.monotonic,
    ) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.window_s = window_s
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self._clock = clock
        self._crashes: collections.deque[float] = collections.deque()
        self.tripped = False

    def _expire(self) -> None:
        horizon = self._clock() - self.window_s
        while self._crashes and self._crashes[0] <= horizon:
            self._crashes.popleft()

    @property
    def count(self) -> int:
        """Crashes within the window, now."""
        self._expire()
        return len(self._crashes)

    def record(self) -> float:
        """Note one crash; return the seconds to wait before the next restart.

        The first crash in the window restarts at once (a one-off crash should cost nothing), then
        the delay doubles from `backoff_base_s` up to `backoff_cap_s`.
        """
        self._crashes.append(self._clock())
        n = self.count
        if n >= self.limit:
            self.tripped = True
        return self.delay_for(n)

    def delay_for(self, n: int) -> float:
        if n <= 1:
            return 0.0
        from driver.protocol.backoff import delay, exponential

        # tenacity's capped exponential; the second crash in the window is its first retry.
        return delay(exponential(base=self.backoff_base_s, cap=self.backoff_cap_s), n - 1)

    def started(self) -> bool:
        """A start succeeded: inputs may go through again. Returns whether a crash loop was cleared."""
        was = self.tripped
        self.tripped = False
        return was


# -- bounds from the environment -----------------------------------------------------------------

# Variable → (KernelOptions field, unit). Durations are given in milliseconds, counts as integers.
ENV_OPTIONS: dict[str, tuple[str, str]] = {
    "AGENT_DRIVER_CANCEL_GRACE_MS": ("cancel_interrupt_grace_s", "ms"),
    "AGENT_DRIVER_TERM_GRACE_MS": ("cancel_term_grace_s", "ms"),
    "AGENT_DRIVER_PROVIDER_START_TIMEOUT_MS": ("provider_start_timeout_s", "ms"),
    "AGENT_DRIVER_PROVIDER_STOP_TIMEOUT_MS": ("provider_stop_timeout_s", "ms"),
    "AGENT_DRIVER_PROVIDER_SILENCE_MS": ("provider_silence_timeout_s", "ms"),
    "AGENT_DRIVER_STOP_DRAIN_TIMEOUT_MS": ("stop_drain_timeout_s", "ms"),
    "AGENT_DRIVER_RESTART_BACKOFF_MS": ("restart_backoff_base_s", "ms"),
    "AGENT_DRIVER_RESTART_BACKOFF_CAP_MS": ("restart_backoff_cap_s", "ms"),
    "AGENT_DRIVER_CRASH_LOOP_LIMIT": ("crash_loop_limit", "count"),
    "AGENT_DRIVER_CRASH_LOOP_WINDOW_MS": ("crash_loop_window_s", "ms"),
    "AGENT_DRIVER_OUTBOX_MAX_EVENTS": ("outbox_max_events", "count"),
    "AGENT_DRIVER_OUTBOX_MAX_BYTES": ("outbox_max_bytes", "count"),
    "AGENT_DRIVER_ATTACHMENT_TIMEOUT_MS": ("attachment_timeout_s", "ms"),
    "AGENT_DRIVER_SKILL_TIMEOUT_MS": ("skill_timeout_s", "ms"),
}


class EnvOptionError(ValueError):
    def __init__(self, variable: str, value: str) -> None:
        unit = ENV_OPTIONS[variable][1]
        what = "a non-negative number of milliseconds" if unit == "ms" else "a positive integer"
        super().__init__(f"{variable} must be {what} (got {value!r})")
        self.variable = variable


def options_from_env(environ: Mapping[str, str]) -> dict[str, float | int]:
    """The KernelOptions fields set by `AGENT_DRIVER_*` variables (see ENV_OPTIONS). Raises
    EnvOptionError naming the variable for a value that is not a valid number."""
    out: dict[str, float | int] = {}
    for variable, (name, unit) in ENV_OPTIONS.items():
        raw = environ.get(variable)
        if raw is None or raw.strip() == "":
            continue
        try:
            if unit == "ms":
                ms = float(raw)
                if not ms >= 0 or ms == float("inf"):
                    raise ValueError
                out[name] = ms / 1000.0
            else:
                count = int(raw)
                if count < 1:
                    raise ValueError
                out[name] = count
        except ValueError:
            raise EnvOptionError(variable, raw) from None
    return out
