"""Outbox unit tests (PROTOCOL §4, §4.1): backpressure, batching, receipts, retries, best-effort drops."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from driver.protocol.frames import Receipt, Rejection, encode_events_frame
from driver.queue.best_effort import BestEffortBuffer
from driver.queue.journal import Journal
from driver.queue.outbox import Batch, Outbox, RetryPolicy

INSTANCE = "drv-unit"
SESSION = "ses-unit"
BIG = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


def make(journal: Journal, clock: Clock, **kw: Any) -> Outbox:
    kw.setdefault("retry", RetryPolicy(receipt_timeout=10.0, base=1.0, cap=8.0))
    box = Outbox(journal, INSTANCE, SESSION, 1, clock=clock, **kw)
    box.on_link_up()
    return box


@pytest.fixture
async def box(journal: Journal, clock: Clock) -> AsyncIterator[Outbox]:
    yield make(journal, clock)


def msg(text: str, message_id: str = "m1") -> bytes:
    return json.dumps({"message_id": message_id, "role": "assistant", "text": text}).encode()


def delta(text: str, message_id: str = "m1") -> bytes:
    return json.dumps({"message_id": message_id, "text": text}).encode()


async def lossless(box: Outbox, n: int, run_id: str | None = "run-1", text: str = "x") -> list[str]:
    return [await box.admit("message.completed", msg(f"{text}{i}"), "lossless", run_id) for i in range(n)]


def events_of(batch: Batch) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(encode_events_frame(batch.number, batch.frame_events))["events"]
    return events


def ids_of(batch: Batch) -> list[str]:
    return [e["event_id"] for e in events_of(batch)]


def take(box: Outbox, max_events: int = 256, max_bytes: int = BIG) -> Batch:
    batch = box.take_batch(max_events, max_bytes)
    assert batch is not None
    return batch


# -- admission and durability -----------------------------------------------------------------------
async def test_event_ids_and_seqs_are_stamped_at_admission(box: Outbox) -> None:
    ids = await lossless(box, 3)
    assert ids == [f"{INSTANCE}/1/000001", f"{INSTANCE}/1/000002", f"{INSTANCE}/1/000003"]
    await box.flush()
    events = events_of(take(box))
    assert [(e["event_id"], e["seq"], e["epoch"], e["delivery"]) for e in events] == [
        (i, n + 1, 1, "lossless") for n, i in enumerate(ids)
    ]
    assert events[0]["session_id"] == SESSION and events[0]["run_id"] == "run-1"
    assert events[0]["payload"] == {"message_id": "m1", "role": "assistant", "text": "x0"}


async def test_nothing_is_sent_before_the_group_commit(box: Outbox, journal: Journal) -> None:
    await lossless(box, 2)
    assert box.take_batch(256, BIG) is None
    assert list(journal.pending()) == []
    await box.flush()
    assert [p[0] for p in journal.pending()] == [1, 2]
    assert len(take(box).lossless_seqs) == 2


async def test_restart_resends_with_the_same_bytes(journal: Journal, clock: Clock, tmp_path: Path) -> None:
    box = make(journal, clock)
    await lossless(box, 2)
    await box.flush()
    before = take(box).frame_events
    journal.close()
    j2 = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    try:
        box2 = Outbox(j2, INSTANCE, SESSION, 2, clock=clock)
        assert box2.recovered == 2
        box2.on_link_up()
        assert take(box2).frame_events == before
        # A new event of the new process gets a seq above everything the old one reserved.
        new_id = await box2.admit("message.completed", msg("new"), "lossless", "run-1")
        assert new_id.startswith(f"{INSTANCE}/2/") and int(new_id.rsplit("/", 1)[1]) > 2
    finally:
        j2.close()


# -- backpressure -----------------------------------------------------------------------------------
async def _admit_blocks_until_receipt(box: Outbox) -> None:
    done = anyio.Event()

    async def producer() -> None:
        await box.admit("message.completed", msg("late"), "lossless", "run-1")
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set(), "admit did not wait on a full outbox"
        await box.flush()
        batch = take(box)
        assert not done.is_set(), "sending alone must not free space: only a receipt does"
        box.on_receipt(Receipt(batch=batch.number, accepted=[ids_of(batch)[0]]))
        with anyio.fail_after(5):
            await done.wait()
    assert box.pending_count == len(batch.lossless_seqs)


async def test_admit_waits_when_full_by_count(journal: Journal, clock: Clock) -> None:
    box = make(journal, clock, max_events=3)
    await lossless(box, 3)
    await _admit_blocks_until_receipt(box)


async def test_admit_waits_when_full_by_bytes(journal: Journal, clock: Clock) -> None:
    box = make(journal, clock, max_bytes=500)
    await lossless(box, 2, text="y" * 200)
    await _admit_blocks_until_receipt(box)


async def test_best_effort_is_never_held_back_by_a_full_outbox(journal: Journal, clock: Clock) -> None:
    box = make(journal, clock, max_events=1)
    await lossless(box, 1)
    with anyio.fail_after(1):
        await box.admit("message.delta", delta("hi"), "best_effort", "run-1")
    assert len(box.best_effort) == 1


# -- batches ----------------------------------------------------------------------------------------
async def test_batches_respect_max_events_and_go_oldest_first(box: Outbox) -> None:
    ids = await lossless(box, 7)
    await box.flush()
    first, second, third = take(box, 3), take(box, 3), take(box, 3)
    assert ids_of(first) == ids[0:3] and ids_of(second) == ids[3:6] and ids_of(third) == ids[6:]
    assert box.take_batch(3, BIG) is None


async def test_retried_events_go_before_newer_ones(box: Outbox, clock: Clock) -> None:
    ids = await lossless(box, 4)
    await box.flush()
    first = take(box, 2)
    take(box, 2)
    box.on_receipt(Receipt(batch=first.number))  # nothing stored: ids 0 and 1 wait one backoff step
    ids += await lossless(box, 1, text="new")
    await box.flush()
    assert ids_of(take(box)) == [ids[4]]
    ids += await lossless(box, 1, text="newer")
    await box.flush()
    clock.now += 1.0
    box.expire()
    assert ids_of(take(box)) == [ids[0], ids[1], ids[5]]


async def test_batches_respect_max_bytes(box: Outbox) -> None:
    await lossless(box, 10, text="z" * 150)
    await box.flush()
    sizes = []
    while (batch := box.take_batch(256, 1000)) is not None:
        frame = encode_events_frame(batch.number, batch.frame_events)
        assert len(frame) <= 1000
        sizes.append(len(batch.frame_events))
    assert sum(sizes) == 10 and max(sizes) > 1


async def test_a_single_event_larger_than_max_bytes_still_goes_alone(box: Outbox) -> None:
    await lossless(box, 2, text="w" * 2000)
    await box.flush()
    assert len(take(box, 256, 1000).frame_events) == 1
    assert len(take(box, 256, 1000).frame_events) == 1


async def test_best_effort_does_not_push_a_batch_over_max_bytes(box: Outbox) -> None:
    await lossless(box, 1, text="v" * 300)
    await box.flush()
    lossless_size = len(encode_events_frame(1, take(box).frame_events))
    box.on_link_down()
    box.on_link_up()
    await box.admit("message.delta", delta("d" * 300), "best_effort", "run-1")
    # Room for the lossless event but not for both: the delta must wait for the next batch.
    batch = take(box, 256, lossless_size + 100)
    frame = encode_events_frame(batch.number, batch.frame_events)
    assert len(frame) <= lossless_size + 100, "best-effort event appended beyond max_bytes"
    assert [e["delivery"] for e in events_of(batch)] == ["lossless"]
    assert [e["delivery"] for e in events_of(take(box))] == ["best_effort"]


async def test_best_effort_envelope_counts_toward_max_bytes(box: Outbox) -> None:
    long_run = "run-" + "r" * 120
    for i in range(6):
        await box.admit("message.delta", delta(f"{i}", message_id=f"m{i}"), "best_effort", long_run)
    sent = 0
    while (batch := box.take_batch(256, 900)) is not None:
        frame = encode_events_frame(batch.number, batch.frame_events)
        assert len(batch.frame_events) == 1 or len(frame) <= 900
        sent += len(batch.frame_events)
    assert sent == 6


# -- receipts ---------------------------------------------------------------------------------------
async def test_receipts_match_by_event_id_not_position(box: Outbox, journal: Journal, clock: Clock) -> None:
    ids = await lossless(box, 3)
    await box.flush()
    batch = take(box)
    # Accept only the last one, listed first; the others are in neither list.
    assert box.on_receipt(Receipt(batch=batch.number, accepted=[ids[2]])) == []
    await box.flush()
    assert [p[1] for p in journal.pending()] == ids[:2]
    assert box.take_batch(256, BIG) is None, "an unreceipted event is resent after a backoff, not at once"
    clock.now += 1.0
    box.expire()
    assert ids_of(take(box)) == ids[:2]


async def test_unknown_and_duplicate_receipts_are_harmless(box: Outbox) -> None:
    ids = await lossless(box, 2)
    await box.flush()
    batch = take(box)
    receipt = Receipt(batch=batch.number, accepted=[*ids, "drv-unit/1/999999", "garbage"])
    assert box.on_receipt(receipt) == []
    assert box.on_receipt(receipt) == []
    assert box.on_receipt(Receipt(batch=batch.number + 50, accepted=ids)) == []
    assert box.pending_count == 0


async def test_final_rejection_is_returned_and_removed(box: Outbox, journal: Journal) -> None:
    ids = await lossless(box, 2, run_id="run-9")
    await box.flush()
    batch = take(box)
    rejection = Rejection(ids[0], "event.invalid", "bad payload", retryable=False)
    finals = box.on_receipt(Receipt(batch=batch.number, accepted=[ids[1]], rejected=[rejection]))
    assert [(f.event_id, f.kind, f.run_id, f.rejection.code) for f in finals] == [
        (ids[0], "message.completed", "run-9", "event.invalid")
    ]
    await box.flush()
    assert list(journal.pending()) == []
    assert box.snapshot().final_rejections == 1


async def test_retryable_rejection_is_retried_after_backoff(box: Outbox, clock: Clock) -> None:
    ids = await lossless(box, 1)
    await box.flush()
    batch = take(box)
    rejection = Rejection(ids[0], "store.busy", "later", retryable=True)
    assert box.on_receipt(Receipt(batch=batch.number, rejected=[rejection])) == []
    assert box.take_batch(256, BIG) is None
    wait = box.expire()
    assert wait is not None and wait == pytest.approx(1.0)
    clock.now += 0.5
    box.expire()
    assert box.take_batch(256, BIG) is None
    clock.now += 0.5
    box.expire()
    again = take(box)
    assert ids_of(again) == ids
    assert box.snapshot().retries == 1


async def test_retry_delay_grows_and_is_capped() -> None:
    policy = RetryPolicy(base=0.25, cap=30.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.25, 0.5, 1.0, 2.0]
    assert policy.delay(40) == 30.0


async def test_batch_without_receipt_times_out_and_is_resent(box: Outbox, clock: Clock) -> None:
    ids = await lossless(box, 2)
    await box.flush()
    take(box)
    clock.now += 9.9
    box.expire()
    assert box.take_batch(256, BIG) is None
    clock.now += 0.1
    box.expire()  # the batch times out: its events wait one backoff step
    clock.now += 1.0
    box.expire()
    assert ids_of(take(box)) == ids


async def test_late_receipt_for_an_old_batch_still_counts(box: Outbox, clock: Clock) -> None:
    ids = await lossless(box, 2)
    await box.flush()
    old = take(box)
    clock.now += 10.0
    box.expire()
    clock.now += 1.0
    box.expire()
    new = take(box)
    assert ids_of(new) == ids
    box.on_receipt(Receipt(batch=old.number, accepted=ids))
    assert box.pending_count == 0
    box.on_receipt(Receipt(batch=new.number, accepted=ids))  # the duplicate answer changes nothing
    assert box.pending_count == 0


async def test_link_down_puts_in_flight_back_oldest_first(box: Outbox) -> None:
    ids = await lossless(box, 4)
    await box.flush()
    take(box, 2)
    box.on_link_down()
    box.on_link_up()
    assert ids_of(take(box)) == ids


async def test_receipted_and_drained(box: Outbox) -> None:
    ids = await lossless(box, 2)
    box.watch(ids[0])
    box.watch(ids[1])
    await box.flush()
    batch = take(box)
    finals = box.on_receipt(
        Receipt(batch=batch.number, accepted=[ids[0]], rejected=[Rejection(ids[1], "x", "y", retryable=False)])
    )
    assert len(finals) == 1
    with anyio.fail_after(5):
        assert await box.receipted(ids[0]) == "accepted"
        assert await box.receipted(ids[1]) == "rejected"
        await box.flush()
        await box.drained()


# -- best-effort ------------------------------------------------------------------------------------
async def test_best_effort_is_dropped_and_counted_while_link_down(box: Outbox, journal: Journal) -> None:
    box.on_link_down()
    await box.admit("message.delta", delta("a"), "best_effort", "run-1")
    await box.admit("thought.delta", json.dumps({"thought_id": "t", "text": "b"}).encode(), "best_effort", "run-2")
    await box.flush()
    assert len(box.best_effort) == 0 and list(journal.pending()) == []
    assert box.snapshot().best_effort_dropped == 2
    assert box.dropped_for_run("run-1") == 1 and box.dropped_for_run("run-2") == 1
    assert box.dropped_for_run("run-3") == 0


async def test_best_effort_seqs_interleave_with_lossless(box: Outbox) -> None:
    a = await box.admit("message.delta", delta("a"), "best_effort", "run-1")
    b = await box.admit("message.completed", msg("a"), "lossless", "run-1")
    assert int(a.rsplit("/", 1)[1]) + 1 == int(b.rsplit("/", 1)[1])


async def test_best_effort_without_receipt_is_dropped_not_resent(box: Outbox, clock: Clock) -> None:
    await box.admit("message.delta", delta("a"), "best_effort", "run-1")
    await box.admit("message.delta", delta("b", "m2"), "best_effort", "run-1")
    batch = take(box)
    assert len(batch.best_effort) == 2
    box.on_receipt(Receipt(batch=batch.number, accepted=[batch.best_effort[0].event_id]))
    assert box.dropped_for_run("run-1") == 1
    second = await box.admit("message.delta", delta("c"), "best_effort", "run-1")
    take(box)
    clock.now += 11
    box.expire()
    assert box.dropped_for_run("run-1") == 2
    clock.now += 60
    box.expire()
    assert box.take_batch(256, BIG) is None, f"{second} was sent twice"


async def test_coalescing_joins_consecutive_deltas_of_one_message_only(box: Outbox) -> None:
    await box.admit("message.delta", delta("He", "m1"), "best_effort", "run-1")
    await box.admit("message.delta", delta("llo", "m1"), "best_effort", "run-1")
    await box.admit("message.delta", delta("x", "m2"), "best_effort", "run-1")
    await box.admit("message.delta", delta("!", "m1"), "best_effort", "run-1")
    await box.admit("thought.delta", json.dumps({"thought_id": "m1", "text": "t"}).encode(), "best_effort", "run-1")
    await box.admit("message.delta", delta("?", "m1"), "best_effort", "run-2")
    events = events_of(take(box))
    assert [(e["kind"], e["run_id"], e["payload"]) for e in events] == [
        ("message.delta", "run-1", {"message_id": "m1", "text": "Hello"}),
        ("message.delta", "run-1", {"message_id": "m2", "text": "x"}),
        ("message.delta", "run-1", {"message_id": "m1", "text": "!"}),
        ("thought.delta", "run-1", {"thought_id": "m1", "text": "t"}),
        ("message.delta", "run-2", {"message_id": "m1", "text": "?"}),
    ]
    # The joined event keeps the first delta's identity.
    assert events[0]["event_id"] == f"{INSTANCE}/1/000001" and events[0]["seq"] == 1


async def test_dropping_a_coalesced_event_counts_every_delta_in_it(box: Outbox) -> None:
    for piece in "abc":
        await box.admit("message.delta", delta(piece), "best_effort", "run-1")
    assert len(box.best_effort) == 1
    box.on_link_down()
    assert box.dropped_for_run("run-1") == 3
    assert box.snapshot().best_effort_dropped == 3


async def test_full_best_effort_buffer_drops_and_counts(journal: Journal, clock: Clock) -> None:
    box = make(journal, clock, best_effort=BestEffortBuffer(max_events=2))
    for i in range(4):
        await box.admit("message.delta", delta("x", f"m{i}"), "best_effort", "run-1")
    assert len(box.best_effort) == 2
    assert box.dropped_for_run("run-1") == 2
    assert [e["payload"]["message_id"] for e in events_of(take(box))] == ["m0", "m1"]


async def test_forget_run_clears_its_drop_count(box: Outbox) -> None:
    box.on_link_down()
    await box.admit("message.delta", delta("a"), "best_effort", "run-1")
    assert box.dropped_for_run("run-1") == 1
    box.best_effort.forget_run("run-1")
    assert box.dropped_for_run("run-1") == 0
    assert box.snapshot().best_effort_dropped == 1


async def test_a_crash_before_the_group_commit_loses_only_unsent_events(
    journal: Journal, clock: Clock, tmp_path: Path
) -> None:
    """`admit` returns before the fsync (group commit): what a crash loses was never sent, and its seqs
    are never handed out again."""
    box = make(journal, clock)
    kept = await lossless(box, 1)
    await box.flush()
    lost = await lossless(box, 2)
    assert [ids_of(b) for b in [take(box)]] == [kept]
    journal.close()  # the process dies here: the two later admissions were never journaled
    j2 = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    try:
        box2 = Outbox(j2, INSTANCE, SESSION, 2, clock=clock)
        box2.on_link_up()
        assert box2.recovered == 1 and ids_of(take(box2)) == kept
        fresh = await box2.admit("message.completed", msg("after"), "lossless", "run-1")
        assert int(fresh.rsplit("/", 1)[1]) > max(int(i.rsplit("/", 1)[1]) for i in lost)
    finally:
        j2.close()


async def test_concurrent_producer_writer_sender_and_lossy_control_plane(journal: Journal, clock: Clock) -> None:
    """The async API as the kernel and link use it: a producer held back by a small outbox, the group
    commit writer, a sender, and a control plane that stores a random part of each batch; time only
    moves when every task is blocked. Everything admitted ends stored once, and `drained` returns."""
    import random

    rng = random.Random(20261129)
    box = make(journal, clock, max_events=16)
    stored: dict[str, dict[str, Any]] = {}
    admitted: list[str] = []
    batches: list[Batch] = []
    got_batch = anyio.Event()

    async def producer() -> None:
        for i in range(120):
            admitted.append(await box.admit("message.completed", msg(f"p{i}"), "lossless", "run-1"))
            if i % 3 == 0:
                await box.admit("message.delta", delta(f"d{i}"), "best_effort", "run-1")
            if i % 7 == 0:
                await anyio.lowlevel.checkpoint()

    async def sender() -> None:
        nonlocal got_batch
        while True:
            await box.wait_sendable()
            batch = box.take_batch(rng.randint(1, 20), BIG)
            if batch is None:
                await anyio.lowlevel.checkpoint()
                continue
            batches.append(batch)
            got_batch.set()

    async def control_plane() -> None:
        nonlocal got_batch
        while True:
            await got_batch.wait()
            got_batch = anyio.Event()
            while batches:
                batch = batches.pop(0)
                if rng.random() < 0.2:
                    continue  # lost: no receipt, the batch times out
                accepted = []
                for event in events_of(batch):
                    if event["event_id"] in stored or rng.random() < 0.6:
                        assert stored.setdefault(event["event_id"], event) == event
                        accepted.append(event["event_id"])
                box.on_receipt(Receipt(batch=batch.number, accepted=accepted))

    async def ticker() -> None:
        while True:
            await anyio.wait_all_tasks_blocked()
            clock.now += 1.0
            box.expire()
            await anyio.lowlevel.checkpoint()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(box.run)
            tg.start_soon(sender)
            tg.start_soon(control_plane)
            tg.start_soon(ticker)
            await producer()
            await box.flush()
            await box.drained()
            tg.cancel_scope.cancel()
    assert len(admitted) == 120
    lossless_stored = [e for e in stored.values() if e["delivery"] == "lossless"]
    assert sorted(e["event_id"] for e in lossless_stored) == sorted(admitted)
    assert list(journal.pending()) == []
    # Best-effort deltas (coalesced or not): each stored at most once, and stored + dropped = admitted.
    pieces = [p for e in stored.values() if e["delivery"] == "best_effort" for p in e["payload"]["text"].split("d")]
    pieces = [p for p in pieces if p]
    assert len(pieces) == len(set(pieces))
    assert len(pieces) + box.dropped_for_run("run-1") == 40


async def test_a_producer_faster_than_the_disk_waits_for_the_writer(box: Outbox) -> None:
    """Bodies not yet journaled cannot be evicted from memory, so admission stops at a bound of
    unjournaled bytes until the writer commits (memory bounded by the disk's pace)."""
    from driver.queue.outbox import UNSYNCED_MAX_BYTES

    big = msg("x" * 256 * 1024)
    admitted = 0
    while admitted * len(big) <= UNSYNCED_MAX_BYTES:
        await box.admit("message.completed", big, "lossless", "run-1")
        admitted += 1
    blocked = anyio.Event()
    done = anyio.Event()

    async def one_more() -> None:
        blocked.set()
        await box.admit("message.completed", big, "lossless", "run-1")
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(one_more)
        await blocked.wait()
        for _ in range(10):
            await anyio.lowlevel.checkpoint()
        assert not done.is_set()  # no writer ran: the producer is held
        await box.flush()  # the writer commits: the producer goes on
        with anyio.fail_after(5):
            await done.wait()
    assert box.pending_count == admitted + 1
