"""Pure checks over collected observations: what the CP received and stored, what processes and files
were seen. Every claim's verdict is computed here from plain values, so a broken history (an event
removed, one stored twice, a process left alive, a token found) is shown to fail without providers.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TERMINALS = frozenset({"run.completed", "run.failed", "run.cancelled"})
# Lossless kinds that exist at most once per identity: a second one is a duplicate, whatever its id.
_ONCE_PER = {
    "run.started": "run_id",
    "message.completed": "message_id",
    "tool.completed": "tool_call_id",
    "command.finished": "command_id",
    "permission.resolved": "request_id",
}
_STEP = re.compile(r"step (\d+)")

Event = Mapping[str, Any]


@dataclass
class Accounting:
    """Lossless events: the CP's view against what reached it."""

    received: int = 0  # distinct lossless event ids the CP received on the wire
    stored: int = 0  # lossless events in the store
    lost: list[str] = field(default_factory=list)  # why each loss counts (an id, or a hole)
    duplicated: list[str] = field(default_factory=list)
    resent_ids: int = 0  # ids received more than once (resends: allowed, must be stored once)
    # PROTOCOL §4.1: within an epoch the durable events are a prefix of the admitted ones; a hole in
    # an epoch's run of flood steps (a newer step stored, an older one of the same epoch not) breaks it.
    prefix_holes: list[str] = field(default_factory=list)

    def measured(self) -> dict[str, Any]:
        return {
            "lossless_received": self.received,
            "lossless_stored": self.stored,
            "lossless_lost": len(self.lost),
            "lossless_duplicated": len(self.duplicated),
            "resent_ids": self.resent_ids,
            "durable_prefix_per_epoch": not self.prefix_holes,
        }

    def failures(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} lossless event(s) lost: {', '.join(self.lost[:3])}")
        if self.duplicated:
            out.append(f"{len(self.duplicated)} lossless event(s) stored twice: {', '.join(self.duplicated[:3])}")
        if self.prefix_holes:
            out.append(f"durable events not a prefix within an epoch: {', '.join(self.prefix_holes[:3])}")
        return out


def _payload_key(event: Event, name: str) -> Any:
    payload = event.get("payload") or {}
    return payload.get(name) if isinstance(payload, Mapping) else None


def flood_steps(events: Iterable[Event]) -> list[int]:
    """The flood agent's step numbers (`plan.updated` entries "step N") in stored order."""
    out = []
    for e in events:
        if e["kind"] == "plan.updated":
            entries = _payload_key(e, "entries") or []
            m = _STEP.fullmatch(str(entries[0].get("content", ""))) if entries else None
            if m:
                out.append(int(m.group(1)))
    return out


def account(received: Iterable[Event], stored: Sequence[Event], *, open_runs_ok: Iterable[str] = ()) -> Accounting:
    """Count lost and duplicated lossless events.

    Lost: an id the CP received but did not store; a run without exactly one `run.started` before its
    terminal or (unless listed in `open_runs_ok`, e.g. a run whose sandbox died) without a terminal; a
    completed run whose started message or tool has no completion; a hole in the flood agent's steps.
    Duplicated: an event id or a seq stored twice; a second event of a once-per-identity kind (two
    terminals of a run, two `message.completed` of a message, ...); a flood step stored twice.
    """
    acc = Accounting()
    seen = Counter(e["event_id"] for e in received if e.get("delivery") == "lossless")
    acc.received = len(seen)
    acc.resent_ids = sum(1 for n in seen.values() if n > 1)
    ll = [e for e in stored if e.get("delivery") == "lossless"]
    acc.stored = len(ll)
    ids = Counter(e["event_id"] for e in ll)
    acc.lost += [f"{i} (received, not stored)" for i in sorted(set(seen) - set(ids))]
    acc.duplicated += [f"{i} (same id)" for i, n in ids.items() if n > 1 for _ in range(n - 1)]
    by_seq: dict[tuple[str, int], set[str]] = defaultdict(set)
    for e in ll:
        by_seq[(_instance(e), int(e["seq"]))].add(e["event_id"])
    acc.duplicated += [f"seq {s} ({len(v)} ids)" for (_, s), v in by_seq.items() if len(v) > 1]
    identities: Counter[tuple[str, str, Any]] = Counter()
    for e in ll:
        name = _ONCE_PER.get(e["kind"])
        if name is not None:
            identities[(_instance(e), e["kind"], e.get("run_id") if name == "run_id" else _payload_key(e, name))] += 1
        if e["kind"] in TERMINALS:
            identities[(_instance(e), "terminal", e.get("run_id"))] += 1
    acc.duplicated += [f"{k} {ident} x{n}" for (_, k, ident), n in identities.items() if n > 1 and ident is not None]
    acc.lost += _run_holes(ll, set(open_runs_ok))
    steps_by_run: dict[Any, list[int]] = defaultdict(list)
    for e in ll:
        steps_by_run[e.get("run_id")].extend(flood_steps([e]))
    acc.prefix_holes += epoch_prefix_holes(ll)
    for run_id, got in steps_by_run.items():
        counts = Counter(got)
        acc.duplicated += [f"{run_id} step {s}" for s, n in counts.items() if n > 1]
        if got:
            acc.lost += [f"{run_id} step {s} (hole)" for s in range(max(got)) if s not in counts]
    return acc


def epoch_prefix_holes(lossless: Iterable[Event]) -> list[str]:
    """Holes inside one epoch's flood steps of a run, in seq order: the agent numbers its steps in
    admission order, so within an epoch the stored ones must be consecutive."""
    by: dict[tuple[str, Any, Any], list[tuple[int, int]]] = defaultdict(list)
    for e in lossless:
        for step in flood_steps([e]):
            by[(_instance(e), e.get("epoch"), e.get("run_id"))].append((int(e["seq"]), step))
    out = []
    for (_, epoch, run_id), pairs in by.items():
        got = [step for _, step in sorted(pairs)]
        expected = list(range(got[0], got[0] + len(got)))
        if got != expected:
            missing = sorted(set(expected) - set(got))[:3] or got[:3]
            out.append(f"{run_id} epoch {epoch} steps {missing}")
    return out


def unjournaled_bound(step_bytes: float, unsynced_max_bytes: int, pipe_bytes: int, acp_step_bytes: int) -> int:
    """The most flood steps a SIGKILL may lose by design: what fits in the outbox's admitted-not-
    journaled window (its byte cap over the lossless bytes of a step), plus what the provider's pipe
    and the driver's reader can hold unread."""
    return int(unsynced_max_bytes / max(step_bytes, 1.0)) + pipe_bytes // max(acp_step_bytes, 1) + 1


def _instance(event: Event) -> str:
    """The instance of an event, from its id (`instance/epoch/seq`): seqs are unique per instance."""
    return str(event["event_id"]).rsplit("/", 2)[0]


def _run_holes(ll: Sequence[Event], open_ok: set[str]) -> list[str]:
    runs: dict[str, list[Event]] = defaultdict(list)
    for e in ll:
        if e.get("run_id"):
            runs[str(e["run_id"])].append(e)  # run ids are unique across the instances of one history
    out = []
    for run_id, events in runs.items():
        kinds = [e["kind"] for e in events]
        if "run.started" not in kinds:
            out.append(f"{run_id}: run.started")
        terms = [e for e in events if e["kind"] in TERMINALS]
        if not terms:
            if run_id not in open_ok:
                out.append(f"{run_id}: terminal")
            continue
        if terms[0]["kind"] != "run.completed":
            continue
        for started, done, key in (
            ("message.started", "message.completed", "message_id"),
            ("tool.started", "tool.completed", "tool_call_id"),
        ):
            opened = {_payload_key(e, key) for e in events if e["kind"] == started}
            closed = {_payload_key(e, key) for e in events if e["kind"] == done}
            out += [f"{run_id}: {done} of {i}" for i in sorted(opened - closed, key=str)]
    return out


# -- resume ----------------------------------------------------------------------------------------


def run_outcome(terminal: Event | None) -> str:
    """`run.failed{driver.restarted}`, `run.completed`, ... or `open` (no terminal stored)."""
    if terminal is None:
        return "open"
    if terminal["kind"] == "run.failed":
        error = _payload_key(terminal, "error") or {}
        return f"run.failed{{{error.get('code')}}}"
    return str(terminal["kind"])


def native_session(reset_seen: bool, earlier_in_next_request: bool | None) -> str:
    """`resumed` (the model saw the earlier conversation, no reset), `reset+replayed` (a reset, and the
    replayed transcript reached the model), `reset` (nothing came back), `lost`, or `unknown`."""
    if earlier_in_next_request is None:
        return "unknown"
    if reset_seen:
        return "reset+replayed" if earlier_in_next_request else "reset"
    return "resumed" if earlier_in_next_request else "lost"


def judge_resume(measured: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """Failures of one resume case against its row of PROTOCOL §8's matrix. `expected` maps a measured
    field to the allowed values (a tuple) or the one value; absent fields are not judged."""
    out = []
    for key, allowed in expected.items():
        options = allowed if isinstance(allowed, tuple) else (allowed,)
        if measured.get(key) not in options:
            out.append(f"{key} = {measured.get(key)!r}, expected {' or '.join(map(repr, options))}")
    return out


# -- isolation ---------------------------------------------------------------------------------------


def token_findings(places: Mapping[str, bytes | str | None], token: str) -> dict[str, str]:
    """For each place (a child's environ, a file, a log, the stored events, a probe's read): `absent`,
    `FOUND` or `unreadable` (None: the place could not be read, which is what a boundary should give)."""
    out = {}
    for place, content in places.items():
        if content is None:
            out[place] = "unreadable"
            continue
        data = content.encode() if isinstance(content, str) else content
        out[place] = "FOUND" if token.encode() in data else "absent"
    return out


def judge_token(findings: Mapping[str, str]) -> list[str]:
    found = sorted(p for p, v in findings.items() if v == "FOUND")
    return [f"the control token was found in {', '.join(found)}"] if found else []


# -- processes and cancellation ----------------------------------------------------------------------


def judge_processes_gone(left: Sequence[Mapping[str, Any]], what: str) -> list[str]:
    if not left:
        return []
    names = ", ".join(f"{p.get('pid')} {p.get('argv0', '')}".strip() for p in left[:5])
    return [f"{len(left)} {what} process(es) still alive: {names}"]


def judge_side_effects(
    terminal_payload: Mapping[str, Any] | None, files_changed: Iterable[str], processes_left: Iterable[int]
) -> list[str]:
    """PROTOCOL §5: `run.cancelled` names the tool calls and the side effects (files changed under cwd,
    provider-tree processes still alive when the terminal was chosen); checked against what the
    evidence run saw happen."""
    if terminal_payload is None:
        return ["no run.cancelled stored"]
    out = []
    if not isinstance(terminal_payload.get("tool_calls"), list):
        out.append("run.cancelled has no tool_calls list")
    effects = terminal_payload.get("side_effects")
    if not isinstance(effects, Mapping):
        return [*out, "run.cancelled has no side_effects object"]
    reported_files = {str(f.get("path")) for f in effects.get("files_changed") or [] if isinstance(f, Mapping)}
    missing = sorted(set(files_changed) - reported_files)
    if missing:
        out.append(f"side_effects.files_changed misses {', '.join(missing)}")
    reported_pids = {int(p.get("pid", -1)) for p in effects.get("processes_left") or [] if isinstance(p, Mapping)}
    unreported = sorted(set(processes_left) - reported_pids)
    if unreported:
        out.append(f"side_effects.processes_left misses pids {unreported}")
    return out


# -- numbers -------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    k = max(0, min(len(ordered) - 1, -(-len(ordered) * p // 100) - 1))
    return round(float(ordered[int(k)]), 1)


def summary_ms(values: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50_ms": percentile(values, 50),
        "p95_ms": percentile(values, 95),
        "p99_ms": percentile(values, 99),
    }
