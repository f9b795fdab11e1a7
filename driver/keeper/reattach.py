"""Reattach after a driver restart (PROTOCOL §8.2): the plan a new driver process makes from what its
predecessor left, and the gate that keeps the continued run's events neither lost nor duplicated.

**The plan.** At recovery, before the provider starts, the kernel asks `prepare()`: a keeper recorded
under `state_dir/driver/keeper/` that is still the recorded process (pid and start time), for this
runtime, with reattach enabled. The adapter then `take()`s the plan at its start and connects to the
keeper instead of spawning a provider. When the turn the keeper's `turn.json` names is a run the journal
holds as active, that run is continued: the adapter reads the provider's output again from the offset
its turn started at, through a fresh turn translator.

**The gate (exact, without journaling adapter state).** A turn translator is deterministic: the same
output gives the same events in the same order. The journal counts, in the same transaction that makes
them durable, the lossless events of each run that are derived from provider output (`DERIVED_KINDS`:
`Journal.derived_count`). Replaying the turn re-derives them: the first `derived_count` are the ones
already journaled, and are suppressed; every later one is admitted. Best-effort events (deltas) derived
from output that was already in the log when this process attached are dropped (best-effort is at most
once: the predecessor may have sent them); those from output written after are sent.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver import logs
from driver.keeper import kept
from driver.keeper import state as keeper_state
from driver.queue.schema import DERIVED_KINDS

log = logs.get(__name__)


@dataclass
class Plan:
    state_dir: Path
    record: kept.Record
    thread_id: str | None
    run_id: str | None  # the run to continue (active in the journal), else None: attach while idle
    offset: int | None  # where to read the output from (None: the log's end)
    first_id: int
    answered: frozenset[Any]
    proc: kept.KeptProcess | None = None  # set by the adapter once attached
    attached: bool = False
    turn: kept.Turn | None = None  # what the predecessor marked last (its adapter's `extra` included)


_plans: dict[Path, Plan] = {}


def prepare(state_dir: Path, runtime: str, grace_ms: int, active_runs: list[str]) -> Plan | None:
    """What a predecessor left that this process can attach to (blocking: call from a worker thread).
    A keeper that cannot be used is ended, and so is its provider tree."""
    record = kept.read_record(state_dir)
    if record is None:
        return None
    if grace_ms <= 0 or record.runtime != runtime or not record.alive() or not kept.supported():
        if kept.discard(state_dir):
            log.warning("keeper.discarded", keeper_pid=record.keeper_pid)
        return None
    if not hmac.compare_digest(record.fingerprint, keeper_state.fingerprint()):
        # Configured by another boot payload (model, policy, key, upstreams, revision): not ours to adopt.
        # Its tree ends; the run it carried ends driver.restarted (PROTOCOL §8.2).
        kept.discard(state_dir)
        log.warning("keeper.not_adopted", keeper_pid=record.keeper_pid, reason="boot payload differs")
        return None
    turn = kept.read_turn(state_dir)
    if turn is None:
        # The predecessor died before its provider's session was open: nothing worth keeping.
        kept.discard(state_dir)
        return None
    run_id = turn.run_id if turn.run_id in active_runs else None
    if run_id is not None and _in_log_size(state_dir) <= turn.in_offset:
        # Marked, but the predecessor died before writing the turn's request: nothing to continue
        # (the run ends driver.restarted; the idle provider is still attached).
        log.info("keeper.turn_never_sent", run_id=run_id)
        run_id = None
    first_id, answered = kept.stdin_facts(state_dir)
    plan = Plan(
        state_dir,
        record,
        turn.thread_id,
        run_id,
        turn.offset if run_id is not None else None,
        first_id,
        frozenset(answered),
        turn=turn,
    )
    _plans[state_dir] = plan
    log.info("keeper.found", keeper_pid=record.keeper_pid, run_id=run_id, offset=plan.offset)
    return plan


def _in_log_size(state_dir: Path) -> int:
    try:
        return (kept.keeper_dir(state_dir) / "in.log").stat().st_size
    except OSError:
        return 0


def take(state_dir: Path) -> Plan | None:
    """The plan for the adapter starting now (once: a later replacement spawns a fresh provider)."""
    return _plans.pop(state_dir, None)


@dataclass
class ReplayGate:
    """Decides, for each event a continued run's adapter emits, whether it is admitted."""

    journaled: int  # derived lossless events of the run already in the journal
    plan: Plan
    suppressed: int = 0
    dropped_best_effort: int = 0
    _kinds: frozenset[str] = field(default=DERIVED_KINDS)

    def admits(self, kind: str, delivery: str) -> bool:
        if delivery == "best_effort":
            proc = self.plan.proc
            if proc is not None and not proc.past_attach():
                self.dropped_best_effort += 1
                return False
            return True
        if kind in self._kinds and self.suppressed < self.journaled:
            self.suppressed += 1
            return False
        return True

    @property
    def replaying(self) -> bool:
        return self.suppressed < self.journaled
