"""Deletions of receipted events ride on the next group commit (driver/queue/outbox_writer.py, DELETE_FLUSH_S).

A receipt must not start a journal transaction (and its fsync) of its own: at a steady event rate that
added up to one fsync per event and held the writer when the next event arrived (issue 10's latency goal).
Deletions still reach the disk: with the next admitted event's commit, alone after DELETE_FLUSH_S of
quiet, and at once for whoever waits for `drained()`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from driver.protocol.frames import Receipt
from driver.queue import outbox_writer as outbox_module
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox, RetryPolicy

Commit = tuple[list[int], list[int]]  # (seqs written, seqs deleted) of one journal transaction


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


def recorded(journal: Journal) -> tuple[list[Commit], anyio.Event]:
    """Record every transaction the outbox makes; the event is set after a deletion-only one."""
    commits: list[Commit] = []
    alone = anyio.Event()
    real = journal.commit

    def commit(events: object, deleted: object, reserve_through: int = 0, *rest: object) -> None:
        rows, gone = list(events), list(deleted)  # type: ignore[call-overload]
        real(rows, gone, reserve_through, *rest)  # type: ignore[arg-type]
        commits.append(([r[0] for r in rows], gone))
        if gone and not rows:
            anyio.from_thread.run_sync(alone.set)  # the writer commits in a worker thread

    journal.commit = commit  # type: ignore[method-assign]
    return commits, alone


def make(journal: Journal) -> Outbox:
    box = Outbox(journal, "drv-unit", "ses-unit", 1, retry=RetryPolicy(receipt_timeout=10.0, base=1.0, cap=8.0))
    box.on_link_up()
    return box


async def admit_and_send(box: Outbox, n: int) -> Receipt:
    """Admit one event, wait for its group commit (it becomes sendable), take its batch; the receipt
    that accepts it."""
    payload = json.dumps({"message_id": f"m{n}", "role": "assistant", "text": "x"}).encode()
    event_id = await box.admit("message.completed", payload, "lossless", None)
    with anyio.fail_after(5):
        await box.wait_sendable()
    batch = box.take_batch(256, 1 << 20)
    assert batch is not None and batch.lossless_seqs == [n]
    return Receipt(batch=batch.number, accepted=[event_id])


def on_disk(journal: Journal) -> list[int]:
    return [p[0] for p in journal.pending()]


async def test_a_receipt_starts_no_transaction_its_deletion_rides_on_the_next_commit(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "DELETE_FLUSH_S", 3600.0)
    commits, _ = recorded(journal)
    box = make(journal)
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)
        box.on_receipt(await admit_and_send(box, 1))
        # One turn of the loop: a writer woken by the receipt would take the deletion now.
        await anyio.lowlevel.checkpoint()
        assert box.pending_count == 0 and on_disk(journal) == [1], "the deletion waits for a commit"
        box.on_receipt(await admit_and_send(box, 2))
        tg.cancel_scope.cancel()
    assert commits == [([1], []), ([2], [1])], "one transaction per event, the deletion in the next one"


async def test_deletions_are_committed_alone_after_a_quiet_delay(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox_module, "DELETE_FLUSH_S", 0.2)
    commits, alone = recorded(journal)
    box = make(journal)
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)
        receipt = await admit_and_send(box, 1)
        received_at = anyio.current_time()
        box.on_receipt(receipt)
        with anyio.fail_after(5):
            await alone.wait()
        waited = anyio.current_time() - received_at
        tg.cancel_scope.cancel()
    assert waited >= 0.2, f"committed {waited:.3f} s after the receipt, before DELETE_FLUSH_S"
    assert commits == [([1], []), ([], [1])]
    assert on_disk(journal) == []


@pytest.mark.parametrize("waiting_first", [False, True], ids=["receipt-then-drained", "drained-then-receipt"])
async def test_drained_does_not_wait_for_the_quiet_delay(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, waiting_first: bool
) -> None:
    monkeypatch.setattr(outbox_module, "DELETE_FLUSH_S", 3600.0)
    box = make(journal)
    done = anyio.Event()

    async def wait_drained() -> None:
        await box.drained()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)
        receipt = await admit_and_send(box, 1)
        if waiting_first:
            tg.start_soon(wait_drained)
            await anyio.lowlevel.checkpoint()
            assert not done.is_set()
        box.on_receipt(receipt)
        if not waiting_first:
            tg.start_soon(wait_drained)
        with anyio.fail_after(5):
            await done.wait()
        tg.cancel_scope.cancel()
    assert on_disk(journal) == [], "drained means gone from disk"


async def test_a_pile_of_deletions_is_committed_without_waiting(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A flood's receipts: deferring every deletion to the end would put one huge transaction on the
    # critical path of drained(); from DELETE_BATCH_MAX waiting deletions on they are committed at once.
    monkeypatch.setattr(outbox_module, "DELETE_FLUSH_S", 3600.0)
    monkeypatch.setattr(outbox_module, "DELETE_BATCH_MAX", 2)
    commits, alone = recorded(journal)
    box = make(journal)
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)
        ids = []
        for n in (1, 2):
            payload = json.dumps({"message_id": f"m{n}", "role": "assistant", "text": "x"}).encode()
            ids.append(await box.admit("message.completed", payload, "lossless", None))
        with anyio.fail_after(5):
            await box.wait_sendable()
        batch = box.take_batch(256, 1 << 20)
        assert batch is not None and batch.lossless_seqs == [1, 2]
        box.on_receipt(Receipt(batch=batch.number, accepted=ids))
        with anyio.fail_after(5):
            await alone.wait()
        tg.cancel_scope.cancel()
    assert [(rows, sorted(gone)) for rows, gone in commits] == [([1, 2], []), ([], [1, 2])]  # a set's order
    assert on_disk(journal) == []
