"""The choice of a run's one terminal, as a table (driver/kernel/runs.py)."""

from __future__ import annotations

from typing import Any

import pytest

from driver.adapters.common.base import ProviderError, TurnOutcome
from driver.kernel.runs import Run, choose_terminal, declined_tool_events
from driver.protocol.events import validate_payload

DONE = TurnOutcome("completed", final_message_id="m1", final_message_text="hi", usage={"output_tokens": 3})
PROVIDER_CANCELLED = TurnOutcome("cancelled", stop_reason="cancelled")
FAILED = TurnOutcome("failed", error_code="max_tokens", error_message="ran out of tokens")
CRASH = ProviderError("provider.crashed", "the provider exited", retryable=True, details={"stderr_tail": "boom"})


def run(cancelled_by: str | None = None) -> Run:
    r = Run("run-1", "cmd-1")
    r.tools_started = {"t2": "Write", "t1": "Bash"}
    if cancelled_by:
        r.cancel_requested_by, r.cancel_reason, r.cancel_phase = cancelled_by, "user", "terminate"
    return r


@pytest.mark.parametrize(
    ("cancelled_by", "outcome", "error", "kind", "check"),
    [
        (None, DONE, None, "run.completed", {"final_message_text": "hi", "final_message_id": "m1"}),
        (None, PROVIDER_CANCELLED, None, "run.cancelled", {"requested_by": "provider"}),
        (None, FAILED, None, "run.failed", {"error": {"code": "max_tokens"}}),
        (None, None, CRASH, "run.failed", {"error": {"code": "provider.crashed", "retryable": True}}),
        # A cancel chosen first wins over everything the provider then reports.
        ("control_plane", DONE, None, "run.cancelled", {"requested_by": "control_plane"}),
        ("control_plane", None, CRASH, "run.cancelled", {"requested_by": "control_plane"}),
        ("signal", FAILED, None, "run.cancelled", {"requested_by": "signal", "reason": "user"}),
    ],
)
async def test_terminal_table(
    cancelled_by: str | None, outcome: TurnOutcome | None, error: ProviderError | None, kind: str, check: dict[str, Any]
) -> None:
    got_kind, payload = choose_terminal(run(cancelled_by), outcome, error, dropped=4)
    assert got_kind == kind
    validate_payload(got_kind, payload)  # every terminal payload fits the protocol's schema
    assert payload["dropped_best_effort"] == 4
    for key, value in check.items():
        if isinstance(value, dict):
            assert {k: payload[key][k] for k in value} == value
        else:
            assert payload[key] == value


async def test_cancel_details_name_the_phase_and_the_started_tools() -> None:
    r = run("control_plane")
    r.tool_status["t1"] = "completed"
    effects = {"files_changed": [{"path": "a.txt", "change": "created"}], "processes_left": []}
    _, payload = choose_terminal(r, DONE, None, dropped=0, side_effects=effects)
    assert payload["details"]["phase"] == "terminate"
    assert payload["details"]["tool_calls_started"] == ["t1", "t2"]
    # PROTOCOL §5: the tool calls with their last status, and the side effects as measured.
    assert [(t["tool_call_id"], t["status"]) for t in payload["tool_calls"]] == [("t1", "completed"), ("t2", "running")]
    assert payload["side_effects"] == effects
    validate_payload("run.cancelled", payload)


async def test_a_run_needs_some_ending() -> None:
    with pytest.raises(ValueError):
        choose_terminal(run(), None, None, dropped=0)


async def test_declined_tools_are_completed_and_announced_when_the_provider_did_not() -> None:
    r = run()
    r.tools_completed = {"t1"}
    events = declined_tool_events(r, {"t1", "t2", "t9"})
    assert [(k, p["tool_call_id"]) for k, p in events] == [
        ("tool.completed", "t2"),  # started by the provider, never completed
        ("tool.started", "t9"),  # never announced: announce, then decline
        ("tool.completed", "t9"),
    ]
    assert all(p["status"] == "declined" for k, p in events if k == "tool.completed")
