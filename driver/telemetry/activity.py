"""What the provider is doing, for every heartbeat (PROTOCOL §2.5) and for the liveness rule (§8).

The kernel tells the tracker about the provider's output and its tool calls (as their events pass);
the tracker reads the provider tree from /proc when asked. Nothing here waits or spawns.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from driver.protocol.frames import HeartbeatActivity as Activity
from driver.telemetry.proctree import TreeMeter, TreeReader, TreeSample

Clock = Callable[[], float]
Sampler = Callable[[list[int]], TreeSample]


class ActivityTracker:
    def __init__(
        self, roots: Callable[[], list[int]], *, clock: Clock = time.monotonic, sampler: Sampler | None = None
    ):
        self._roots = roots  # the provider's process group leaders (pgid = pid: they called setsid)
        self._clock = clock
        self._sampler = sampler or TreeReader().sample
        self.meter = TreeMeter()
        self._meter_roots: tuple[int, ...] = ()
        self.last_output: float | None = None
        self._tools: dict[str, float] = {}  # running tool_call_id → started at, in start order

    # -- what the kernel reports -----------------------------------------------------------------
    def provider_output(self) -> None:
        self.last_output = self._clock()

    def tool_started(self, tool_call_id: str) -> None:
        self._tools.setdefault(tool_call_id, self._clock())

    def tool_finished(self, tool_call_id: str) -> None:
        self._tools.pop(tool_call_id, None)

    def run_ended(self) -> None:
        """A tool call a run left open (a cancelled run, a crashed provider) is not running anymore."""
        self._tools.clear()

    # -- reading ---------------------------------------------------------------------------------
    def sample(self) -> TreeSample:
        """Read the provider tree now; a new provider (other roots) starts a new CPU counter."""
        roots = self._roots()
        if tuple(roots) != self._meter_roots:
            self._meter_roots = tuple(roots)
            self.meter = TreeMeter()
        return self.meter.update(self._sampler(roots) if roots else TreeSample(0, 0, 0))

    @property
    def cpu_ms(self) -> float:
        """The current provider's cumulative CPU (call `sample()` first for a fresh figure)."""
        return self.meter.cpu_ms

    def activity(self) -> Activity:
        now = self._clock()
        tree = self.sample()
        out = Activity()
        if self._meter_roots and tree.processes:
            out.provider_pid = self._meter_roots[0]
            out.provider_cpu_ms = int(self.meter.cpu_ms)
            out.provider_rss_mb = round(tree.rss_mb, 1)
            out.provider_processes = tree.processes
        if self.last_output is not None:
            out.last_provider_output_ms_ago = int((now - self.last_output) * 1000)
        if self._tools:
            tool_call_id, started = next(reversed(self._tools.items()))  # the newest running call
            out.tool_call_id = tool_call_id
            out.tool_running_ms = int((now - started) * 1000)
        return out


def describe(activity: Mapping[str, Any] | None) -> str:
    """One human line for a heartbeat's `activity` (the dev console's `/status`, the CP's API)."""
    if not activity:
        return "no activity reported yet"
    parts: list[str] = []
    if activity.get("provider_pid") is None:
        parts.append("no provider process")
    else:
        cpu_s = (activity.get("provider_cpu_ms") or 0) / 1000
        parts.append(
            f"provider pid {activity['provider_pid']}: {activity.get('provider_processes')} processes, "
            f"{activity.get('provider_rss_mb')} MB, cpu {cpu_s:.1f} s"
        )
    ago = activity.get("last_provider_output_ms_ago")
    parts.append("no output yet" if ago is None else f"last output {ago / 1000:.1f} s ago")
    if activity.get("tool_call_id"):
        parts.append(f"tool {activity['tool_call_id']} running {(activity.get('tool_running_ms') or 0) / 1000:.1f} s")
    return " | ".join(parts)
