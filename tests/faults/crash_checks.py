"""Invariants of a control plane's store after driver crashes (issue 19 item 7, PROTOCOL §3, §4.1).

Read only from the reference control plane's SQLite store, so they judge the driver from outside:
- **prefix per epoch**: within each epoch, the stored lossless events of each run are a prefix of what
  that epoch admitted: the flood agent's numbered steps have no hole, and every step before the last
  stored one has its `message.started` too (the lossless events between steps);
- **no fact twice**: no event id stored twice (check_instance), at most one `command.finished` per
  command, and at most one `run.started` and one terminal per run;
- **counted means known**: every command at or below any `last_command_seq` a driver announced has a
  terminal status at the CP;
- **terminal and input.start agree**: each run's terminal kind matches its `input.start` status.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from agent_lab.controlplane.server import ControlPlane

from tests.faults.history import TERMINALS, check_instance, check_run, lossless, steps
from tests.integration.harness import INSTANCE

STATUS_OF = {"run.completed": "completed", "run.failed": "failed", "run.cancelled": "cancelled"}


def check_prefix_per_epoch(events: list[dict[str, Any]]) -> None:
    by: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in lossless(events):
        if e["run_id"]:
            by[(e["epoch"], e["run_id"])].append(e)
    for (epoch, run_id), evs in by.items():
        evs.sort(key=lambda e: e["seq"])
        got = steps(evs)
        if not got:
            continue
        assert got == list(range(got[0], got[0] + len(got))), f"epoch {epoch} {run_id}: step hole {got}"
        last_step_seq = max(e["seq"] for e in evs if e["kind"] == "plan.updated")
        started = [e for e in evs if e["kind"] == "message.started" and e["seq"] < last_step_seq]
        # Step i is plan.updated, then message.started: every step before the last has its started.
        assert len(started) >= len(got) - 1, f"epoch {epoch} {run_id}: {len(started)} started for {len(got)} steps"


def check_store(cp: ControlPlane, counted: list[int], flood_steps: int) -> dict[str, Any]:
    """All invariants; `counted`: every `last_command_seq` a driver announced. Returns a summary."""
    events = check_instance(cp)
    check_prefix_per_epoch(events)
    finished = Counter(e["payload"]["command_id"] for e in lossless(events) if e["kind"] == "command.finished")
    assert not [c for c, n in finished.items() if n > 1], f"a command.finished twice: {finished.most_common(3)}"
    commands = cp.commands(INSTANCE)
    by_seq = {c["seq"]: c for c in commands}
    for top in counted:
        for seq in range(1, top + 1):
            c = by_seq.get(seq)
            assert c is not None and c["status"] in STATUS_OF.values(), (
                f"last_command_seq {top} counts command {seq}, whose status the CP does not have: {c}"
            )
    runs = {e["run_id"] for e in lossless(events) if e["kind"] == "run.started"}
    for c in commands:
        if c["kind"] != "input.start":
            continue
        run_id = c["body"]["run_id"]
        if run_id not in runs:
            continue
        term = check_run(cp, run_id, terminal=TERMINALS, flood_steps=flood_steps)
        assert c["status"] == STATUS_OF[term["kind"]], (run_id, term["kind"], c["status"])
    return {"events": len(events), "commands": len(commands), "runs": len(runs)}
