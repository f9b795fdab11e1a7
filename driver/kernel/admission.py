"""The events port's decision (PROTOCOL §4.1, §8.2), free of I/O: which run an event is stamped with,
and whether it is admitted at all.

An event of a run whose terminal is chosen is dropped (its terminal excepted); `host_tool.called`
names its own run; an event re-derived after a reattach passes the run's replay gate
(driver/keeper/reattach.py) or is dropped, a best-effort one then counted as dropped (at most once).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from driver.protocol.events import RUN_TERMINALS, EventKind

if TYPE_CHECKING:
    from driver.kernel.runs import Run  # not imported before the first hello (driver/kernel/core.py)

HOST_TOOL_CALLED = "host_tool.called"  # run-scoped, but stamped with the run its payload names


@dataclass(frozen=True, slots=True)
class Verdict:
    admitted: bool
    run_id: str | None = None
    dropped: Literal["", "after_terminal", "replayed"] = ""  # why it was not admitted
    count_drop: bool = False  # a best-effort event the replay gate dropped: counted for its run


AFTER_TERMINAL = Verdict(False, dropped="after_terminal")


def judge(kind: str, spec: EventKind, payload: dict[str, Any], run: Run | None) -> Verdict:
    """The verdict on one event, given the active run. An event stamped with the active run is noted
    on it (`note`) whether or not the replay gate then admits it."""
    run_id: str | None = None
    if spec.run_scoped and kind != HOST_TOOL_CALLED:
        if run is not None:
            if run.terminal is not None and kind not in RUN_TERMINALS:
                return AFTER_TERMINAL
            run_id = run.run_id
            note(run, kind, payload)
    elif kind == HOST_TOOL_CALLED:
        run_id = payload.get("run_id")
    replay = run.replay if run is not None and run_id == run.run_id else None
    if replay is not None and not replay.admits(kind, spec.delivery):
        return Verdict(False, run_id, dropped="replayed", count_drop=spec.delivery == "best_effort")
    return Verdict(True, run_id)


def note(run: Run, kind: str, payload: dict[str, Any]) -> None:
    """The run's own record of its events: its last activity (the silence watch) and its tool calls
    (a cancelled run's terminal names them, PROTOCOL §5)."""
    run.last_activity = time.monotonic()
    if kind == "tool.started":
        run.tools_started.setdefault(str(payload.get("tool_call_id")), str(payload.get("name", "")))
    elif kind == "tool.completed":
        run.tools_completed.add(str(payload.get("tool_call_id")))
        run.tool_status[str(payload.get("tool_call_id"))] = str(payload.get("status", ""))
