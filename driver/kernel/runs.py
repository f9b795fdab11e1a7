"""A run's bookkeeping and the choice of its one terminal event (PROTOCOL §4.2, §5), without I/O.

The kernel owns the I/O around a run (the adapter call, the cancel escalation, admitting events);
what ends a run, and with which payload, is decided here, from plain values, so it can be tested as
a table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from driver.adapters.common.base import Adapter, ProviderError, TurnOutcome
from driver.kernel.side_effects import TreeSnapshot

CancelPhase = Literal["interrupt", "terminate", "kill"]


@dataclass
class Run:
    run_id: str
    command_id: str
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    terminal: str | None = None  # the chosen terminal kind, once chosen
    cancel_requested_by: str | None = None
    cancel_reason: str = ""
    cancel_phase: CancelPhase = "interrupt"
    tools_started: dict[str, str] = field(default_factory=dict)  # tool_call_id → name
    tools_completed: set[str] = field(default_factory=set)
    tool_status: dict[str, str] = field(default_factory=dict)  # tool_call_id → its last status
    # For run.cancelled's side effects (PROTOCOL §5): cwd and the provider tree as the run started.
    files_before: TreeSnapshot | None = None
    processes_before: set[int] = field(default_factory=set)
    ended: anyio.Event = field(default_factory=anyio.Event)
    adapter: Adapter | None = None  # the adapter running this run (signals go to its groups)
    forced_error: ProviderError | None = None  # set when the kernel ends the run for its provider
    last_activity: float = field(default_factory=time.monotonic)
    # When it started on the clock /proc counts process start times on (the model proxy's attribution).
    started_boot_s: float = field(default_factory=lambda: time.clock_gettime(time.CLOCK_BOOTTIME))
    signalled_groups: list[int] = field(default_factory=list)
    # Set once the terminal event has its receipt: `turn.cancel` completes then, like `input.start`,
    # so a control plane that sees the cancel completed also has the terminal stored.
    receipted: anyio.Event = field(default_factory=anyio.Event)
    # PROTOCOL §3.1 steering: set when the adapter's turn runs (a steer has somewhere to go); set when
    # a cancel is asked (steers not yet delivered end `cancelled`); steers now on their way.
    turn_running: anyio.Event = field(default_factory=anyio.Event)
    cancel_asked: anyio.Event = field(default_factory=anyio.Event)
    steers_in_flight: int = 0
    steers_settled: anyio.Event = field(default_factory=anyio.Event)
    # A run continued by a new driver process (PROTOCOL §8.2): decides which re-derived events are
    # admitted (driver.keeper.reattach.ReplayGate); None for every other run.
    replay: Any = None


def declined_tool_events(run: Run, rejected: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """PROTOCOL §6.2: a tool call whose permission was rejected ends `tool.completed{declined}`; the
    driver emits it (and a `tool.started` first) when the provider reported neither."""
    out: list[tuple[str, dict[str, Any]]] = []
    for tool_call_id in sorted(rejected):
        if tool_call_id in run.tools_completed:
            continue
        if tool_call_id not in run.tools_started:
            out.append(("tool.started", {"tool_call_id": tool_call_id, "name": "", "title": "", "input": None}))
        out.append(
            ("tool.completed", {"tool_call_id": tool_call_id, "status": "declined", "output": None, "exit_code": None})
        )
    return out


def tool_calls(run: Run) -> list[dict[str, str]]:
    """Every tool call the run started, with its last status ("running" when none was reported)."""
    return [
        {"tool_call_id": tid, "name": name, "status": run.tool_status.get(tid, "running")}
        for tid, name in sorted(run.tools_started.items())
    ]


def choose_terminal(
    run: Run,
    outcome: TurnOutcome | None,
    error: ProviderError | None,
    dropped: int,
    side_effects: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The run's terminal kind and payload. A cancel requested before this choice wins over whatever
    the provider reported; then a provider error; then the provider's own outcome.

    `side_effects` (PROTOCOL §5: files changed under cwd since the run started, provider processes
    still alive) is measured by the caller when a cancel was requested; they are not undone."""
    if run.cancel_requested_by is not None:
        return "run.cancelled", {
            "reason": run.cancel_reason,
            "requested_by": run.cancel_requested_by,
            "dropped_best_effort": dropped,
            "tool_calls": tool_calls(run),
            "side_effects": side_effects or {"files_changed": [], "processes_left": []},
            "details": {
                "phase": run.cancel_phase,
                "tool_calls_started": sorted(run.tools_started),
                "signalled_process_groups": run.signalled_groups,
            },
        }
    if error is not None:
        return "run.failed", {
            "error": {
                "code": error.code,
                "message": error.message,
                "retryable": error.retryable,
                "details": dict(error.details),
            },
            "dropped_best_effort": dropped,
        }
    if outcome is None:
        raise ValueError("a run ends with an outcome, an error or a cancel")
    if outcome.status == "completed":
        return "run.completed", {
            "stop_reason": outcome.stop_reason,
            "final_message_id": outcome.final_message_id,
            "final_message_text": outcome.final_message_text,
            "usage": outcome.usage,
            "dropped_best_effort": dropped,
        }
    if outcome.status == "cancelled":
        return "run.cancelled", {
            "reason": outcome.stop_reason,
            "requested_by": "provider",
            "dropped_best_effort": dropped,
            "tool_calls": tool_calls(run),
            "details": {"phase": "provider", "tool_calls_started": sorted(run.tools_started)},
        }
    return "run.failed", {
        "error": {
            "code": outcome.error_code or "provider.failed",
            "message": outcome.error_message or "the provider reported a failed turn",
            "retryable": outcome.error_retryable,
            "details": outcome.error_details,
        },
        "dropped_best_effort": dropped,
    }
