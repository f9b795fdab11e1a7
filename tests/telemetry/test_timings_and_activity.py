"""Phase timings and the activity tracker without I/O (an injected clock and tree sampler)."""

from __future__ import annotations

from pathlib import Path

from driver.telemetry.activity import ActivityTracker, describe
from driver.telemetry.proctree import TreeSample
from driver.telemetry.timings import Timings


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_cold_start_then_warm_then_resume(tmp_path: Path) -> None:
    clock = Clock()
    marker = tmp_path / "driver" / "provider-started"
    t = Timings(marker, process_start=99.0, clock=clock)
    t.hello_sent()
    t.hello_sent()  # once per process
    t.provider_starting(resume_wanted=None)
    clock.t = 101.0
    t.session_known("ses-1")
    t.session_known("ses-1")  # a second announcement of the same start is not a second phase
    t.provider_ready("ses-1")
    t.run_started("run-1")
    clock.t = 101.25
    t.maybe_first_token("message.started")  # not a token
    t.maybe_first_token("message.delta")
    t.maybe_first_token("message.delta")  # only the first
    assert t.take() == [
        {"phase": "hello", "ms": 1000.0, "mode": "cold"},
        {"phase": "provider.spawn", "ms": 1000.0, "mode": "cold"},
        {"phase": "session.open", "ms": 2000.0, "mode": "cold"},
        {"phase": "provider.ready", "ms": 2000.0, "mode": "cold"},
        {"phase": "first_token", "ms": 250.0, "mode": "cold", "run_id": "run-1"},
    ]
    assert marker.exists() and not t.pending
    # A replacement in the same process resumes: warm spawn, then resume.
    t.provider_starting(resume_wanted="ses-1")
    t.provider_ready("ses-1")  # a runtime that resumed without announcing it
    assert [(r["phase"], r["mode"]) for r in t.take()] == [
        ("provider.spawn", "warm"),
        ("session.resume", "resume"),
        ("provider.ready", "resume"),
    ]
    # A new process on the same state_dir starts warm; a resume that failed opens a fresh session.
    t2 = Timings(marker, process_start=0.0, clock=clock)
    t2.hello_sent()
    t2.provider_starting(resume_wanted="ses-1")
    t2.session_known("ses-2")
    t2.provider_ready("ses-2")
    assert [(r["phase"], r["mode"]) for r in t2.take()] == [
        ("hello", "warm"),
        ("provider.spawn", "warm"),
        ("session.open", "warm"),
        ("provider.ready", "warm"),
    ]
    t2.session_known("ses-3", reset=True)  # session.reset
    assert [(r["phase"], r["mode"]) for r in t2.take()] == [("session.open", "warm")]


def test_activity_from_events_and_the_tree() -> None:
    clock = Clock()
    roots = [812]
    samples = iter([TreeSample(500, 25600, 3), TreeSample(700, 25600, 3), TreeSample(650, 25600, 2)])
    tracker = ActivityTracker(lambda: list(roots), clock=clock, sampler=lambda r: next(samples))
    first = tracker.activity()
    assert (first.provider_pid, first.provider_processes, first.last_provider_output_ms_ago) == (812, 3, None)
    assert first.provider_rss_mb == round(25600 * 4096 / 2**20, 1) and first.tool_call_id is None
    tracker.provider_output()
    tracker.tool_started("call-1")
    clock.t += 2.5
    tracker.tool_started("call-2")
    clock.t += 1.0
    a = tracker.activity()
    assert (a.tool_call_id, a.tool_running_ms, a.last_provider_output_ms_ago) == ("call-2", 1000, 3500)
    assert a.provider_cpu_ms > first.provider_cpu_ms  # type: ignore[operator]
    tracker.tool_finished("call-2")
    b = tracker.activity()  # the tree's sum fell (a process left): the counter does not
    assert (b.tool_call_id, b.tool_running_ms) == ("call-1", 3500) and b.provider_cpu_ms == a.provider_cpu_ms
    tracker.run_ended()
    roots.clear()  # no provider process
    c = tracker.activity()
    assert (c.provider_pid, c.provider_cpu_ms, c.tool_call_id) == (None, None, None)
    assert "no provider process" in describe({"provider_pid": None, "last_provider_output_ms_ago": 10})
