"""Group commit: writes queued together share one transaction; a failing one undoes only itself."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from agent_lab.controlplane.store import CommandExists, Store
from agent_lab.controlplane.writer import GroupWriter

from tests.controlplane.client import INSTANCE


async def test_queued_writes_share_one_commit_and_fail_alone(tmp_path: Path) -> None:
    writer = GroupWriter(tmp_path / "w.db")
    await writer.start()
    try:
        first = await writer.submit(Store.add_command, INSTANCE, "session.reset", {}, "cmd-0")
        assert first["seq"] == 1
        commits_before = writer.commits
        futures = [writer.submit(Store.add_command, INSTANCE, "session.reset", {}, f"cmd-{i}") for i in range(1, 6)]
        clash = writer.submit(Store.add_command, INSTANCE, "session.reset", {}, "cmd-0")
        results = await asyncio.gather(*futures)
        with pytest.raises(CommandExists):
            await clash
        assert writer.commits == commits_before + 1
        assert [r["seq"] for r in results] == [2, 3, 4, 5, 6]
        fresh = sqlite3.connect(tmp_path / "w.db")
        try:
            assert fresh.execute("SELECT COUNT(*) FROM commands").fetchone()[0] == 6
        finally:
            fresh.close()
    finally:
        await writer.close()


async def test_close_finishes_queued_writes(tmp_path: Path) -> None:
    writer = GroupWriter(tmp_path / "w.db")
    await writer.start()
    pending = writer.submit(Store.add_command, INSTANCE, "session.reset", {}, "cmd-late")
    await writer.close()
    assert (await pending)["command_id"] == "cmd-late"
    with pytest.raises(RuntimeError):
        writer.submit(Store.add_command, INSTANCE, "session.reset", {})
