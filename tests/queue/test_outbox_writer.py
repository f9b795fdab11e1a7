"""The one journal writer (issue 19 item 1): commits never overlap and go oldest first, a terminal status
commits with its `command.finished`, `last_command_seq` moves only after that commit, a failed commit
loses nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from driver.queue.command_index import StoredCommand
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


def make(journal: Journal) -> Outbox:
    box = Outbox(journal, "drv-w", "ses-w", 1)
    box.on_link_up()
    return box


Call = tuple[list[int], list[str]]  # (event seqs, command ids with a status) of one transaction


def recorded(journal: Journal) -> tuple[list[Call], list[str]]:
    calls: list[Call] = []
    problems: list[str] = []
    busy = threading.Lock()
    real = journal.commit

    def commit(events: Any, deleted: Any, reserve: int = 0, statuses: Any = (), *rest: Any) -> None:
        if not busy.acquire(blocking=False):
            problems.append("two commits at once")
            busy.acquire()
        try:
            rows, saved = list(events), list(statuses)
            real(rows, deleted, reserve, saved, *rest)
            calls.append(([r[0] for r in rows], [s.command_id for s in saved]))
        finally:
            busy.release()

    journal.commit = commit  # type: ignore[method-assign]
    return calls, problems


async def test_commits_never_overlap_and_go_oldest_first(journal: Journal) -> None:
    calls, problems = recorded(journal)
    box = make(journal)
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)

        async def producer(k: int) -> None:
            for i in range(300):
                await box.admit("message.completed", b'{"n":%d}' % i, "lossless", None)
                if i % 50 == k:
                    await box.flush()  # flushes from several tasks while the writer task commits

        async with anyio.create_task_group() as producers:
            for k in range(3):
                producers.start_soon(producer, k)
        await box.flush()
        tg.cancel_scope.cancel()
    assert problems == []
    seqs = [s for rows, _ in calls for s in rows]
    assert seqs == sorted(seqs) and len(seqs) == len(set(seqs)) == 900


async def test_a_terminal_status_commits_with_its_fact_and_counts_only_after(journal: Journal) -> None:
    calls, _ = recorded(journal)
    box = make(journal)
    gate, entered = threading.Event(), threading.Event()
    real = journal.commit

    def held(*args: Any) -> None:
        entered.set()
        gate.wait(10)  # the commit's fsync, held
        real(*args)

    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)
        await box.save_status(StoredCommand("c1", 1, "fp", "accepted", None, "input.start"))
        journal.commit = held  # type: ignore[method-assign]
        done = anyio.Event()
        payload = json.dumps({"command_id": "c1", "command_kind": "input.start", "status": "completed"}).encode()

        async def finish() -> None:
            await box.admit(
                "command.finished", payload, "lossless", None, StoredCommand("c1", 1, "fp", "completed", b"{}")
            )
            done.set()

        tg.start_soon(finish)
        assert await anyio.to_thread.run_sync(entered.wait, 5)  # the commit has begun (and is held)
        assert journal.last_command_seq() == 0 and not done.is_set()  # not counted before it is durable
        gate.set()
        with anyio.fail_after(5):
            await done.wait()
        assert journal.last_command_seq() == 1
        tg.cancel_scope.cancel()
    stored = journal.command("c1")
    assert stored is not None and stored.status == "completed"
    [fact] = [p.seq for p in journal.pending() if p.kind == "command.finished"]
    # `held` calls the recording wrapper: `accepted` alone (it has no fact), then status + fact together.
    assert calls == [([], ["c1"]), ([fact], ["c1"])]


async def test_a_failed_commit_is_retried_with_everything_it_took(journal: Journal) -> None:
    box = make(journal)
    real = journal.commit
    failures = [2]

    def flaky(*args: Any) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError("disk full")
        real(*args)

    journal.commit = flaky  # type: ignore[method-assign]
    async with anyio.create_task_group() as tg:
        tg.start_soon(box.run)
        for i in range(5):
            await box.admit("message.completed", b'{"n":%d}' % i, "lossless", None)
        await box.save_status(StoredCommand("c1", 1, "fp", "accepted", None))
        with anyio.fail_after(10):
            await box.flush()
        tg.cancel_scope.cancel()
    assert failures == [0]
    seqs = [p.seq for p in journal.pending()]
    assert seqs == list(range(seqs[0], seqs[0] + 5))  # all five, in order, after two failed attempts
    assert journal.command("c1") is not None
