"""The provider liveness rule of PROTOCOL §8, without I/O.

A run is unresponsive when, for `limit_s` counted from the later of the run's start, the provider's
last output and the last moment something waited on the control plane, the provider's whole tree
used at most `cpu_fraction` of one core. CPU is judged over that whole window (work done in it, not a
momentary rate), so a tool that computes in bursts with pauses is not failed while it averages more.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CPU_FRACTION = 0.01  # 1 % of one core


@dataclass(frozen=True, slots=True)
class Verdict:
    unresponsive: bool
    quiet_s: float  # time since the later of the run's start, the last output and the last CP wait
    cpu_ms_in_window: float | None  # CPU the tree used over the last limit_s (None: window not full)


class SilenceRule:
    def __init__(self, limit_s: float, *, start: float, cpu_ms: float, cpu_fraction: float = DEFAULT_CPU_FRACTION):
        if limit_s <= 0:
            raise ValueError("limit_s must be positive")
        self.limit_s = limit_s
        self.cpu_fraction = cpu_fraction
        self._quiet_since = start
        # (time, cumulative tree CPU ms); the first entry is the newest one at or before now - limit.
        self._samples: collections.deque[tuple[float, float]] = collections.deque([(start, cpu_ms)])

    def progress(self, at: float) -> None:
        """The provider produced output, or something waited on the control plane, at `at`."""
        self._quiet_since = max(self._quiet_since, at)

    def observe(self, now: float, cpu_ms: float) -> Verdict:
        """One sample of the tree's cumulative CPU; whether the run is unresponsive now."""
        self._samples.append((now, cpu_ms))
        horizon = now - self.limit_s
        while len(self._samples) > 1 and self._samples[1][0] <= horizon:
            self._samples.popleft()
        quiet = now - self._quiet_since
        then, cpu_then = self._samples[0]
        if then > horizon:
            return Verdict(False, quiet, None)
        used = cpu_ms - cpu_then
        if quiet < self.limit_s:
            return Verdict(False, quiet, used)
        budget = self.cpu_fraction * (now - then) * 1000.0
        return Verdict(used <= budget, quiet, used)


async def watch(
    limit_s: float,
    *,
    cpu_ms: Callable[[], float],
    last_output: Callable[[], float | None],
    waiting_on_cp: Callable[[], bool],
    clock: Callable[[], float],
    cpu_fraction: float = DEFAULT_CPU_FRACTION,
) -> Verdict:
    """Sample until the rule declares the run unresponsive; return that verdict (cancel to stop).

    `cpu_ms` reads the provider tree's cumulative CPU (from /proc, about a millisecond of CPU for a
    big tree), so samples are spaced: twenty per window, at most one a second."""
    import anyio

    rule = SilenceRule(limit_s, start=clock(), cpu_ms=cpu_ms(), cpu_fraction=cpu_fraction)
    tick = min(1.0, limit_s / 20)
    while True:
        await anyio.sleep(tick)
        now = clock()
        output = last_output()
        if output is not None:
            rule.progress(output)
        if waiting_on_cp():
            rule.progress(now)
        verdict = rule.observe(now, cpu_ms())
        if verdict.unresponsive:
            return verdict
