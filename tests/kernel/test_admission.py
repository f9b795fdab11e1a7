"""The events port's decision (driver.kernel.admission) and what the driver says about itself
(driver.kernel.announce), without a kernel."""

from __future__ import annotations

from typing import Any

import pytest

from driver.kernel import admission, announce
from driver.kernel.runs import Run
from driver.protocol.events import EVENT_KINDS
from driver.queue.outbox_types import OutboxStats

# A Run holds anyio events: it is made on an event loop.
pytestmark = pytest.mark.anyio


def _judge(kind: str, payload: dict[str, Any], run: Run | None) -> admission.Verdict:
    return admission.judge(kind, EVENT_KINDS[kind], payload, run)


class _Gate:
    """A replay gate that refuses everything (driver/keeper/reattach.py's suppresses what was journaled)."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def admits(self, kind: str, delivery: str) -> bool:
        self.asked.append(kind)
        return False


async def test_run_scoped_events_carry_the_active_run_and_note_its_tools() -> None:
    run = Run("run-1", "cmd-1")
    assert _judge("tool.started", {"tool_call_id": "t1", "name": "Bash"}, run) == admission.Verdict(True, "run-1")
    assert _judge("tool.completed", {"tool_call_id": "t1", "status": "completed"}, run).admitted
    assert run.tools_started == {"t1": "Bash"} and run.tools_completed == {"t1"}
    assert run.tool_status == {"t1": "completed"}
    assert _judge("diagnostic.reported", {}, run) == admission.Verdict(True, None)  # not a run's
    assert _judge("message.delta", {}, None) == admission.Verdict(True, None)  # no run active


async def test_after_the_terminal_only_terminals_pass() -> None:
    run = Run("run-1", "cmd-1")
    run.terminal = "run.completed"
    assert _judge("message.delta", {}, run) == admission.AFTER_TERMINAL
    assert _judge("run.completed", {}, run) == admission.Verdict(True, "run-1")


async def test_host_tool_calls_name_their_own_run() -> None:
    run = Run("run-1", "cmd-1")
    assert _judge("host_tool.called", {"run_id": "run-0"}, run) == admission.Verdict(True, "run-0")


async def test_the_replay_gate_drops_and_counts_only_best_effort_drops() -> None:
    run = Run("run-1", "cmd-1")
    gate = _Gate()
    run.replay = gate
    lossless = _judge("tool.started", {"tool_call_id": "t1", "name": "Bash"}, run)
    best_effort = _judge("message.delta", {}, run)
    assert lossless == admission.Verdict(False, "run-1", dropped="replayed", count_drop=False)
    assert best_effort == admission.Verdict(False, "run-1", dropped="replayed", count_drop=True)
    assert gate.asked == ["tool.started", "message.delta"]
    assert run.tools_started == {"t1": "Bash"}  # noted on the run even when the gate drops it


def test_hello_and_heartbeat_state_the_capabilities_and_the_outbox() -> None:
    supported = frozenset({"text_stream", "steer"})
    entries = announce.capability_entries("openai-app-server", supported)
    by_id = {e["id"]: e for e in entries}
    assert by_id["text_stream"] == {"id": "text_stream", "supported": True}
    assert by_id["steer"]["supported"] is True and "mode" in by_id["steer"]
    assert all(not e["supported"] and "mode" not in e for i, e in by_id.items() if i not in supported)
    stats = OutboxStats()
    stats.lossless_pending, stats.retries = 3, 2
    beat = announce.heartbeat("stopped", run_id=None, stats=stats, activity=None, queued=["run-2"], processes=[])
    assert beat.state == "stopping"  # the wire has no "stopped": the process is on its way out
    assert (beat.outbox.lossless_pending, beat.outbox.retries, beat.queued) == (3, 2, ["run-2"])
