"""Group commit of command statuses: concurrent saves share a transaction; each caller returns only
once its own status is durable; a failed commit fails every caller of its batch."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from driver.queue.command_saver import CommandSaver
from driver.queue.journal import Journal


async def test_concurrent_saves_share_commits_and_are_durable(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")
    commits: list[int] = []
    original = journal.save_commands

    def counting(batch: list) -> None:  # type: ignore[type-arg]
        commits.append(len(batch))
        original(batch)

    journal.save_commands = counting  # type: ignore[method-assign]
    saver = CommandSaver(journal)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            for i in range(1, 201):
                tg.start_soon(saver.save, f"c{i}", i, "fp", "completed", b"{}", "input.start")
    assert sum(commits) == 200
    assert len(commits) < 200  # batched
    journal.close()
    reopened = Journal(tmp_path / "j.sqlite3")
    assert reopened.last_command_seq() == 200
    reopened.close()


async def test_a_failed_commit_fails_its_callers(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3")

    def broken(batch: list) -> None:  # type: ignore[type-arg]
        raise OSError(28, "No space left on device")

    journal.save_commands = broken  # type: ignore[method-assign]
    with anyio.fail_after(10), pytest.raises(OSError, match="No space"):
        await CommandSaver(journal).save("c1", 1, "fp", "accepted", None)
    journal.close()
