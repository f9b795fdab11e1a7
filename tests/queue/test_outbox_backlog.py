"""A backlog in the outbox (issue 10): memory per pending event with the link down, and the
guarantees that the compact pending index must keep (ids derived, not stored; metadata read back
from the journal; compaction under out-of-order receipts)."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import patch

import pytest

from driver.protocol.events import event_id_for
from driver.protocol.frames import Receipt, Rejection
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox
from driver.queue.pending import PendingIndex
from tests.queue.test_outbox import BIG, INSTANCE, SESSION, Clock, ids_of, lossless, make, take

# The goal is ≤ 16 MB for 100,000 pending events in all (≈ 167 B each) and ≤ 64 MB for a million
# (≈ 67 B each), RSS included. The index keeps 22 bytes per event in typed arrays; 40 leaves room
# for the arrays' over-allocation and nothing else: one Python object per event (≥ 56 bytes for the
# smallest tuple of an int) would fail it.
MAX_BYTES_PER_PENDING_EVENT = 40


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


def _plan(i: int) -> bytes:
    return json.dumps({"entries": [{"content": f"step {i} " + "x" * 80, "status": "pending"}]}).encode()


async def _flood(box: Outbox, start: int, n: int) -> None:
    for i in range(start, start + n):
        await box.admit("plan.updated", _plan(i), "lossless", None)
        if i % 1000 == 999:
            await box.flush()  # the writer task's work, done inline: no task group in a unit test
    await box.flush()


async def test_a_pending_event_costs_a_few_dozen_bytes_with_the_link_down(journal: Journal) -> None:
    box = Outbox(journal, INSTANCE, SESSION, 1, clock=Clock())  # never linked: everything stays pending
    n = 30_000
    await _flood(box, 0, 200)  # warm the code paths and caches before measuring
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await _flood(box, 200, n)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert box.pending_count == n + 200
    per_event = (after - before) / n
    assert per_event <= MAX_BYTES_PER_PENDING_EVENT, f"{per_event:.0f} bytes per pending event"


async def test_receipted_backlog_gives_its_memory_back(journal: Journal) -> None:
    box = make(journal, Clock())
    for i in range(5000):
        await box.admit("plan.updated", _plan(i), "lossless", None)
    await box.flush()
    # Receipts out of order: every other event first, so the index has gaps in the middle to compact.
    sent = []
    while (batch := box.take_batch(500, BIG)) is not None:
        sent.append(batch)
    for batch in sent:
        box.on_receipt(Receipt(batch=batch.number, accepted=ids_of(batch)[1::2]))
    await box.flush()
    assert box.pending_count == 2500
    assert len(box._index.seqs) == 2500, "half of the index was gaps: compacted"
    for batch in sent:
        box.on_receipt(Receipt(batch=batch.number, accepted=ids_of(batch)[0::2]))
    await box.flush()
    assert box.pending_count == 0 and len(box._index.seqs) == 0
    assert len(box._bodies) == 0


async def test_ids_of_a_recovered_backlog_span_epochs_and_keep_foreign_ids(journal: Journal, tmp_path: Path) -> None:
    clock = Clock()
    first = make(journal, clock)
    old = await lossless(first, 2)
    await first.flush()
    # An id this driver would not derive (another instance once used this state_dir): kept verbatim.
    foreign = b'{"event_id":"drv-other/1/000003","seq":3,"kind":"message.completed","run_id":"run-1"}'
    journal.append([(3, "drv-other/1/000003", "run-1", "message.completed", foreign)])
    journal.close()
    j2 = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    try:
        second = Outbox(j2, INSTANCE, SESSION, 2, clock=clock)
        second.on_link_up()
        new = await lossless(second, 1)
        await second.flush()
        batch = take(second)
        assert ids_of(batch) == [*old, "drv-other/1/000003", *new] and new[0].startswith(f"{INSTANCE}/2/")
        assert batch.frame_events[2] == foreign, "the foreign row is sent as journaled"
        # Receipts match exact ids: the foreign event's seq under our name is not it.
        second.on_receipt(Receipt(batch=batch.number, accepted=[event_id_for(INSTANCE, 1, 3), *old, *new]))
        assert second.pending_count == 1
        second.on_receipt(Receipt(batch=batch.number, accepted=["drv-other/1/000003"]))
        assert second.pending_count == 0
    finally:
        j2.close()


async def test_a_receipt_cannot_remove_an_event_that_was_never_sent(journal: Journal) -> None:
    box = make(journal, Clock())
    [event_id] = await lossless(box, 1)
    # A CP that guesses the next id: the event is not even journaled yet, so nothing was sent.
    box.on_receipt(Receipt(batch=1, accepted=[event_id]))
    assert box.pending_count == 1
    await box.flush()
    batch = take(box)
    assert ids_of(batch) == [event_id]
    box.on_receipt(Receipt(batch=batch.number, accepted=[event_id]))
    assert box.pending_count == 0


async def test_a_final_rejection_reports_kind_and_run_read_back_from_the_journal(journal: Journal) -> None:
    box = Outbox(journal, INSTANCE, SESSION, 1, clock=Clock())
    ids = await lossless(box, 2, run_id="run-7")
    await box.flush()  # committed with the link down: the bodies are not kept in memory
    box.on_link_up()
    batch = take(box)
    final = Rejection(ids[1], "event.invalid", "no", retryable=False)
    [rejected] = box.on_receipt(Receipt(batch=batch.number, accepted=[ids[0]], rejected=[final]))
    assert (rejected.event_id, rejected.kind, rejected.run_id) == (ids[1], "message.completed", "run-7")


async def test_a_pending_run_terminal_is_found_until_receipted_and_after_a_restart(
    journal: Journal, tmp_path: Path
) -> None:
    clock = Clock()
    box = make(journal, clock)
    await lossless(box, 1, run_id="run-a")
    terminal = await box.admit("run.completed", b'{"stop_reason":"end_turn"}', "lossless", "run-a")
    assert box.pending_terminal_of("run-a") == terminal, "found while not yet journaled too"
    assert box.pending_terminal_of("run-b") is None
    await box.flush()
    journal.close()
    j2 = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    try:
        again = make(j2, clock)
        assert again.pending_terminal_of("run-a") == terminal
        batch = take(again)
        again.on_receipt(Receipt(batch=batch.number, accepted=ids_of(batch)))
        assert again.pending_terminal_of("run-a") is None
    finally:
        j2.close()


async def test_the_oldest_pending_event_and_its_age(journal: Journal) -> None:
    clock = Clock()
    box = make(journal, clock)
    assert (box.snapshot().oldest_pending_seq, box.snapshot().oldest_pending_age_ms) == (None, None)
    ids = await lossless(box, 1)
    clock.now += 2.5
    await lossless(box, 1)
    clock.now += 1.25
    stats = box.snapshot()
    assert (stats.oldest_pending_seq, stats.oldest_pending_age_ms) == (1, 3750)
    await box.flush()
    batch = take(box)
    box.on_receipt(Receipt(batch=batch.number, accepted=ids))
    stats = box.snapshot()
    assert (stats.oldest_pending_seq, stats.oldest_pending_age_ms) == (2, 1250)


async def test_retries_and_link_drops_across_compactions(journal: Journal) -> None:
    """With compaction after every receipt, a retried event keeps its place, id and attempts."""
    clock = Clock()
    with patch.object(PendingIndex, "compact_min", 2):
        box = make(journal, clock)
        ids = await lossless(box, 6)
        await box.flush()
        batch = take(box, max_events=3)
        box.on_receipt(Receipt(batch=batch.number, accepted=ids[:2]))  # ids[2] unanswered: retried
        second = take(box)
        assert ids_of(second) == ids[3:]
        box.on_receipt(Receipt(batch=second.number, accepted=ids[4:]))  # ids[3] unanswered too
        clock.now += 1.0
        box.expire()
        assert ids_of(take(box)) == [ids[2], ids[3]]
        assert box.snapshot().retries == 2
        box.on_link_down()
        box.on_link_up()
        again = take(box)
        assert ids_of(again) == [ids[2], ids[3]], "resent after a reconnect, oldest first"
        box.on_receipt(Receipt(batch=again.number, accepted=ids[2:4]))
        await box.flush()
        assert box.pending_count == 0


async def test_an_event_whose_journal_row_vanished_is_reported_not_retried_forever(journal: Journal) -> None:
    box = Outbox(journal, INSTANCE, SESSION, 1, clock=Clock())
    ids = await lossless(box, 2)
    await box.flush()  # link down: the bodies are on disk only
    journal.delete([1])  # behind the outbox's back (a damaged state_dir)
    box.on_link_up()
    assert ids_of(take(box)) == ids[1:]
    [lost] = box.take_local_rejections()
    assert (lost.event_id, lost.rejection.code, lost.rejection.retryable) == (ids[0], "event.body_missing", False)
    assert box.pending_count == 1
