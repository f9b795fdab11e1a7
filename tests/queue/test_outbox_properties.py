"""Property test of the outbox against a model control plane (PROTOCOL §4, §4.1).

The control plane is modelled as what a SQLite store with a uniqueness rule on `event_id` does: a
dict keyed by event_id, where a duplicate is accepted again and never stored twice. Hypothesis drives
random sequences of admissions, group commits, batches, receipts (full, partial, none, duplicate,
late, lost, retryable and final rejections), link drops, timer expiry on a fake clock, and crashes
(the Outbox object is dropped and a new process reopens the journal with epoch + 1). At the end the
link turns perfect and everything drains; then the durability and dedup invariants must hold.

A crash loses what was admitted but not yet group-committed: `admit` does not wait for the fsync
(see driver/queue/outbox.py). The model tracks that window explicitly and checks that such events
were never sent, which is the guarantee the protocol asks for ("written before they are sent").
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest.mock import patch

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from driver.protocol.frames import Receipt, Rejection, encode_events_frame
from driver.queue.best_effort import BestEffortBuffer
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox, RetryPolicy
from driver.queue.pending import PendingIndex

# Ids of realistic length (the boot schema allows 128 chars): batch size limits must count them.
INSTANCE = "drv-01JD" + "7" * 56
SESSION = "ses-01JD" + "8" * 40
RUNS = ("run-01JDA" + "a" * 30, "run-01JDB" + "b" * 30, "run-01JDC" + "c" * 30)
RETRY = RetryPolicy(receipt_timeout=5.0, base=0.25, cap=2.0)


# -- operations ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Admit:
    run: int
    lossless: bool
    stream: int  # which message of the run a best-effort delta belongs to (coalescing needs repeats)


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Take:
    max_events: int
    max_bytes: int


@dataclass(frozen=True)
class Receive:
    """The CP handles one batch it got on this process's life. `lost`: stored, but no receipt arrives."""

    pick: int
    mode: str  # all | some | none | retryable | final | lost
    mask: int


@dataclass(frozen=True)
class LinkDown:
    pass


@dataclass(frozen=True)
class LinkUp:
    pass


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Crash:
    pass


Op = Admit | Flush | Take | Receive | LinkDown | LinkUp | Advance | Crash

# Which events of a batch a partial or rejecting receipt picks: six independent coin flips (an integer
# mask would mostly be drawn as 0 or all ones, which hides partial receipts).
_mask = st.lists(st.booleans(), min_size=6, max_size=6).map(lambda bits: sum(b << i for i, b in enumerate(bits)))
_receive = st.builds(
    Receive,
    st.integers(0, 1000),
    st.sampled_from(["all", "some", "none", "retryable", "final", "lost"]),
    _mask,
)
_admit = st.builds(Admit, st.integers(0, len(RUNS) - 1), st.booleans(), st.integers(0, 1))
ops = st.one_of(
    _admit,
    _admit,
    st.builds(Admit, st.just(0), st.just(False), st.just(0)),  # a stream of deltas, to coalesce
    st.just(Flush()),
    # Byte limits where one event always fits (a frame never exceeds the limit, PROTOCOL §4.3: a
    # bigger event is cut or finally rejected, tests/queue/test_outbox_oversize.py); 700 holds one.
    st.builds(Take, st.integers(1, 6), st.sampled_from([700, 1200, 4096, 1 << 20])),
    _receive,
    _receive,
    st.just(LinkDown()),
    st.just(LinkUp()),
    st.builds(Advance, st.sampled_from([0.1, 0.5, 2.5, 6.0])),
    st.just(Crash()),
)


# -- the model -------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Admitted:
    event_id: str
    seq: int
    epoch: int
    run_id: str
    tag: str


@dataclass
class SentBatch:
    number: int
    conn: int
    events: list[dict[str, Any]]


@dataclass
class World:
    root: Path
    resident_cap: int = 8 * 1024 * 1024  # small values make sent bodies come back from the journal
    max_events: int = 100_000  # small values make admissions wait (backpressure)
    clock: Clock = field(default_factory=Clock)
    epoch: int = 0
    conn: int = 0
    link_up: bool = False
    tags: int = 0
    # control plane
    cp_store: dict[str, dict[str, Any]] = field(default_factory=dict)
    cp_final: set[str] = field(default_factory=set)
    # driver history
    lossless: dict[str, Admitted] = field(default_factory=dict)
    unflushed: set[str] = field(default_factory=set)
    lost_in_crash: set[str] = field(default_factory=set)
    finals_reported: set[str] = field(default_factory=set)
    # Reported since the last flush: the deletion goes to the journal with the next group commit, and the
    # report (a later lossless admission) with that commit or a later one. A crash before it loses both,
    # so the next process resends the event and reports its final rejection again: the first report
    # never became durable (never reached the CP), so the CP still hears of it exactly once.
    finals_unflushed: set[str] = field(default_factory=set)
    seqs: list[int] = field(default_factory=list)
    # this process only (reset by a crash)
    sent: list[SentBatch] = field(default_factory=list)
    in_flight: dict[int, float] = field(default_factory=dict)  # batch number -> taken at
    be_pieces_admitted: int = 0
    be_pieces_accepted: int = 0

    def open(self) -> None:
        self.journal = Journal(self.root / "journal.sqlite3", synchronous="OFF")
        epoch = self.journal.bump_epoch()
        assert epoch == self.epoch + 1, "the epoch counts processes: +1 per start"
        self.epoch = epoch
        self.outbox = Outbox(
            self.journal,
            INSTANCE,
            SESSION,
            epoch,
            retry=RETRY,
            clock=self.clock,
            resident_bytes_cap=self.resident_cap,
            max_events=self.max_events,
            best_effort=BestEffortBuffer(max_events=8, max_bytes=4096),
        )
        self.sent = []
        self.in_flight = {}
        self.be_pieces_admitted = 0
        self.be_pieces_accepted = 0
        self.link_up = False
        self.conn += 1

    # -- operations --------------------------------------------------------------------------------
    async def apply(self, op: Op) -> None:
        if isinstance(op, Admit):
            await self.admit(op)
        elif isinstance(op, Flush):
            await self.outbox.flush()
            self.unflushed.clear()
            self.finals_unflushed.clear()
        elif isinstance(op, Take):
            self.take(op.max_events, op.max_bytes)
        elif isinstance(op, Receive):
            if self.sent:
                self.receive(self.sent[op.pick % len(self.sent)], op.mode, op.mask)
        elif isinstance(op, LinkDown):
            if self.link_up:
                self.outbox.on_link_down()
                self.link_up = False
                self.in_flight.clear()
                self.conn += 1
        elif isinstance(op, LinkUp):
            if not self.link_up:
                self.outbox.on_link_up()
                self.link_up = True
        elif isinstance(op, Advance):
            self.clock.now += op.seconds
            self.outbox.expire()
            for number, taken in list(self.in_flight.items()):
                if taken + RETRY.receipt_timeout <= self.clock.now:
                    del self.in_flight[number]
        elif isinstance(op, Crash):
            self.lost_in_crash |= self.unflushed
            self.unflushed.clear()
            self.finals_reported -= self.finals_unflushed
            self.finals_unflushed.clear()
            self.journal.close()
            self.open()

    async def admit(self, op: Admit) -> None:
        run_id = RUNS[op.run]
        self.tags += 1
        tag = f"<{self.tags}>"
        if op.lossless:
            payload = {"message_id": f"{run_id}-m{op.stream}", "role": "assistant", "text": tag}
            kind = "message.completed"
        else:
            payload = {"message_id": f"{run_id}-m{op.stream}", "text": tag}
            kind = "message.delta"
        full = self.outbox.pending_count >= self.max_events
        event_id = None
        # A producer that gives up while held back by a full outbox must leave no trace behind.
        with anyio.move_on_after(0):
            event_id = await self.outbox.admit(
                kind, json.dumps(payload).encode(), "lossless" if op.lossless else "best_effort", run_id
            )
        if event_id is None:
            assert op.lossless and full, "admit waited without the outbox being full"
            return
        assert not (op.lossless and full), "admitted into a full outbox"
        prefix, epoch, seq_text = event_id.split("/")
        seq = int(seq_text)
        assert prefix == INSTANCE and int(epoch) == self.epoch
        assert not self.seqs or seq > self.seqs[-1], "seqs increase over the instance's life, across epochs"
        self.seqs.append(seq)
        if op.lossless:
            self.lossless[event_id] = Admitted(event_id, seq, self.epoch, run_id, tag)
            self.unflushed.add(event_id)
        else:
            self.be_pieces_admitted += 1

    def take(self, max_events: int, max_bytes: int) -> None:
        if not self.link_up:
            return
        batch = self.outbox.take_batch(max_events, max_bytes)
        if batch is None:
            return
        frame = encode_events_frame(batch.number, batch.frame_events)
        events = json.loads(frame)["events"]
        assert 0 < len(events) <= max_events
        assert len(frame) <= max_bytes, f"batch frame of {len(frame)} bytes over max_bytes {max_bytes}"
        ids = [e["event_id"] for e in events]
        assert len(set(ids)) == len(ids), "an event twice in one batch"
        lossless_seqs = [e["seq"] for e in events if e["delivery"] == "lossless"]
        assert lossless_seqs == sorted(lossless_seqs), "lossless events go oldest seq first"
        for e in events:
            if e["delivery"] == "lossless":
                assert e["event_id"] not in self.unflushed, "a lossless event was sent before it was journaled"
                assert e["event_id"] not in self.lost_in_crash
        self.sent.append(SentBatch(batch.number, self.conn, events))
        self.in_flight[batch.number] = self.clock.now

    def receive(self, batch: SentBatch, mode: str, mask: int) -> None:
        accepted: list[str] = []
        rejected: list[Rejection] = []
        for i, event in enumerate(batch.events):
            eid = event["event_id"]
            bit = bool(mask >> (i % 6) & 1)
            if eid in self.cp_store:
                # Stable across retries, reconnects and restarts: the resend is byte for byte the same.
                assert self.cp_store[eid] == event, f"{eid} changed between sends"
                accepted.append(eid)
                continue
            if eid in self.cp_final:
                rejected.append(Rejection(eid, "event.invalid", "still invalid", retryable=False))
                continue
            if mode in ("all", "lost") or (mode in ("some", "retryable", "final") and not bit):
                self.cp_store[eid] = event
                accepted.append(eid)
            elif mode == "retryable":
                rejected.append(Rejection(eid, "store.busy", "try later", retryable=True))
            elif mode == "final":
                self.cp_final.add(eid)
                rejected.append(Rejection(eid, "event.invalid", "invalid", retryable=False))
        deliverable = mode != "lost" and self.link_up and batch.conn == self.conn
        if not deliverable:
            return
        finals = self.outbox.on_receipt(Receipt(batch=batch.number, accepted=accepted, rejected=rejected))
        for f in finals:
            assert f.event_id in self.cp_final and f.event_id in self.lossless
            assert f.event_id not in self.finals_reported, "a final rejection reported twice"
            self.finals_reported.add(f.event_id)
            self.finals_unflushed.add(f.event_id)
        if batch.number in self.in_flight:
            del self.in_flight[batch.number]
            ok = set(accepted)
            for event in batch.events:
                if event["delivery"] == "best_effort" and event["event_id"] in ok:
                    self.be_pieces_accepted += event["payload"]["text"].count("<")

    async def drain(self) -> None:
        """A perfect link: everything is sent, stored and receipted; time moves on when nothing is ready."""
        self.outbox.on_link_down()
        self.in_flight.clear()
        self.conn += 1
        self.outbox.on_link_up()
        self.link_up = True
        await self.outbox.flush()
        self.unflushed.clear()
        for _ in range(10_000):
            await self.outbox.flush()
            if self.outbox.pending_count == 0 and len(self.outbox.best_effort) == 0:
                break
            self.take(256, 1 << 20)
            if self.sent and self.sent[-1].number in self.in_flight:
                self.receive(self.sent[-1], "all", 0)
            else:
                self.clock.now += RETRY.cap
                self.outbox.expire()
        else:
            raise AssertionError("the outbox did not drain over a perfect link")
        await self.outbox.flush()

    # -- invariants --------------------------------------------------------------------------------
    def check(self) -> None:
        assert list(self.journal.pending()) == [], "nothing remains in the journal"
        assert self.outbox.pending_count == 0
        for eid, a in self.lossless.items():
            if eid in self.lost_in_crash or eid in self.cp_final:
                assert eid not in self.cp_store
                continue
            stored = self.cp_store.get(eid)
            assert stored is not None, f"admitted lossless {eid} never stored"
            assert stored["seq"] == a.seq and stored["epoch"] == a.epoch and stored["run_id"] == a.run_id
            assert stored["delivery"] == "lossless" and stored["payload"]["text"] == a.tag
        for eid in self.cp_final:
            if eid in self.lossless and eid not in self.lost_in_crash:
                assert eid in self.finals_reported, f"final rejection of {eid} never reported"
        # Per run, the stored lossless events, in admission order, have strictly increasing seqs.
        for run_id in RUNS:
            stored_seqs = [a.seq for eid, a in self.lossless.items() if a.run_id == run_id and eid in self.cp_store]
            assert stored_seqs == sorted(set(stored_seqs))
        # Best-effort: at most once; every piece either delivered with a receipt or counted dropped.
        pieces: list[str] = []
        for eid, event in self.cp_store.items():
            assert eid in self.lossless or event["delivery"] == "best_effort"
            if event["delivery"] == "best_effort":
                pieces += [p for p in event["payload"]["text"].split("<") if p]
        assert len(pieces) == len(set(pieces)), "a best-effort delta was stored twice"
        be = self.outbox.best_effort
        assert len(be) == 0
        assert be.dropped == self.be_pieces_admitted - self.be_pieces_accepted
        assert sum(self.outbox.dropped_for_run(r) for r in RUNS) == be.dropped


async def _scenario(root: Path, script: list[Op], resident_cap: int = 8 << 20, max_events: int = 100_000) -> None:
    world = World(root, resident_cap, max_events)
    world.open()
    try:
        for op in [LinkUp(), *script]:
            await world.apply(op)
        await world.drain()
        world.check()
    finally:
        world.journal.close()


@settings(
    # 120 examples keep the file well under a minute on 2 cores; OUTBOX_EXAMPLES=5000 searches deeper.
    max_examples=int(os.environ.get("OUTBOX_EXAMPLES", "120")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.lists(ops, min_size=1, max_size=60),
    st.sampled_from([8 << 20, 1000]),
    st.sampled_from([100_000, 3]),
    # The pending index compacts from 4096 entries on; 2 makes these short scripts compact often.
    st.sampled_from([4096, 2]),
)
def test_outbox_against_a_model_control_plane(
    script: list[Op], resident_cap: int, max_events: int, compact_min: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp, patch.object(PendingIndex, "compact_min", compact_min):
        anyio.run(_scenario, Path(tmp), script, resident_cap, max_events)


def test_scenario_runs_a_known_script() -> None:
    """A fixed script through the same machinery, so a broken model cannot pass vacuously."""
    script: list[Op] = [
        LinkUp(),
        Admit(0, True, 0),
        Admit(0, False, 0),
        Admit(0, False, 0),
        Flush(),
        Take(10, 1 << 20),
        Receive(0, "some", 0b010),
        Crash(),
        Admit(1, True, 0),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        anyio.run(_scenario, Path(tmp), script)
