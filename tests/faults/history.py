"""Checks of the control plane's stored history after a fault (DESIGN "How we test", item 4).

Each check reads only what the control plane stored, so it judges the driver from the outside:
- every stored event id is unique and is `instance/epoch/seq` of its own fields;
- lossless seqs are unique for the instance (a seq is assigned once, at admission);
- every run starts with `run.started`, has exactly one terminal, and nothing of the run follows it;
- the flood agent's steps of a run are there exactly once, in order, with no hole (all of them when
  the run completed; a prefix when a fault ended it early, which is the "nothing journaled is lost"
  check: a step can only be missing after the last one stored);
- best-effort drops are counted whenever the stored deltas of a message do not add up to its text.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

from agent_lab.controlplane.server import ControlPlane

from tests.integration.harness import INSTANCE

TERMINALS = ("run.completed", "run.failed", "run.cancelled")
_STEP = re.compile(r"step (\d+)")


def lossless(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["delivery"] == "lossless"]


def steps(events: list[dict[str, Any]]) -> list[int]:
    """The flood agent's step numbers, in stored seq order."""
    out: list[int] = []
    for e in events:
        if e["kind"] == "plan.updated":
            m = _STEP.fullmatch(e["payload"]["entries"][0]["content"])
            assert m is not None, e
            out.append(int(m.group(1)))
    return out


def check_instance(cp: ControlPlane) -> list[dict[str, Any]]:
    """Instance-wide invariants; returns every stored event in seq order."""
    events = cp.events(INSTANCE)
    ids = Counter(e["event_id"] for e in events)
    assert not [i for i, n in ids.items() if n > 1], "an event was stored twice"
    for e in events:
        assert e["event_id"] == f"{INSTANCE}/{e['epoch']}/{e['seq']:06d}", e["event_id"]
    seqs = Counter(e["seq"] for e in events)
    assert not [s for s, n in seqs.items() if n > 1], "a seq was used twice"
    return events


def check_run(
    cp: ControlPlane,
    run_id: str,
    *,
    terminal: str | tuple[str, ...] = TERMINALS,
    flood_steps: int | None = None,
    heartbeat_dropped: int = 0,
) -> dict[str, Any]:
    """Run invariants; returns the run's terminal event.

    `flood_steps`: how many steps the flood agent was asked for; all must be stored when the run
    completed, a gap-free prefix otherwise. `heartbeat_dropped`: the best-effort drop count of the
    latest heartbeat, the other place a drop may be counted (a delta can be dropped after the
    terminal was chosen, when its batch loses its receipt).
    """
    check_instance(cp)
    events = cp.events(INSTANCE, run_id=run_id)
    assert events, f"nothing stored for {run_id}"
    ll = lossless(events)
    assert ll[0]["kind"] == "run.started", [e["kind"] for e in ll[:3]]
    assert [e["kind"] for e in ll].count("run.started") == 1
    terms = [e for e in ll if e["kind"] in TERMINALS]
    assert len(terms) == 1, [e["kind"] for e in terms]
    term = terms[0]
    wanted = (terminal,) if isinstance(terminal, str) else terminal
    assert term["kind"] in wanted, term
    after = [e["kind"] for e in events if e["seq"] > term["seq"]]
    assert not after, f"run-scoped events after the terminal: {after}"

    if flood_steps is not None:
        got = steps(events)
        assert got == list(range(len(got))), f"steps out of order, missing or repeated: {got}"
        if term["kind"] == "run.completed":
            assert len(got) == flood_steps, (len(got), flood_steps)

    # Best-effort accounting: a message whose stored deltas do not rebuild its text lost some.
    deltas: dict[str, str] = defaultdict(str)
    for e in events:
        if e["kind"] == "message.delta":
            deltas[e["payload"]["message_id"]] += e["payload"]["text"]
    short = [
        e["payload"]["message_id"]
        for e in ll
        if e["kind"] == "message.completed" and deltas.get(e["payload"]["message_id"], "") != e["payload"]["text"]
    ]
    if short:
        assert term["payload"]["dropped_best_effort"] > 0 or heartbeat_dropped > 0, (
            f"{len(short)} messages lost deltas but no drop was counted"
        )
    return term
