"""The link's sender (driver/net/link.py): a journaled batch goes out without waiting for another turn of
the event loop, and the sender still yields after every batch, so a replayed backlog shares the loop
with receipts, heartbeats and the watchdog."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from driver.net.link import Link, LinkHooks
from driver.protocol.boot import ControlConfig
from driver.protocol.frames import Welcome
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox


class Socket:
    """Stands in for the WebSocket: records frames and, like a socket with room in its buffer, never
    waits in `send`."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    async def send(self, frame: bytes, text: bool = False) -> None:
        self.frames.append(frame)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


async def ready_outbox(journal: Journal, n: int) -> Outbox:
    box = Outbox(journal, "drv-unit", "ses-unit", 1)
    box.on_link_up()
    for i in range(n):
        payload = json.dumps({"message_id": f"m{i}", "role": "assistant", "text": "x"}).encode()
        await box.admit("message.completed", payload, "lossless", None)
    await box.flush()  # journaled: every event is sendable now
    return box


def link_for(box: Outbox) -> Link:
    async def nothing(*_: Any) -> None:
        return None

    hooks = LinkHooks(lambda: b"{}", lambda: b"{}", nothing, nothing, nothing)
    return Link(ControlConfig(url="ws://127.0.0.1:1/", token="t"), "drv-unit", box, hooks)


async def test_one_batch_per_turn_of_the_loop_and_no_turn_before_the_first(journal: Journal) -> None:
    box = await ready_outbox(journal, 3)
    link = link_for(box)
    ws = Socket()
    seen: list[int] = []

    async def observer() -> None:
        # Started right after the sender: it runs at the sender's first yield.
        seen.append(len(ws.frames))

    async with anyio.create_task_group() as tg:
        tg.start_soon(link._sender, ws, Welcome(connection_id="c", max_batch_events=1))
        tg.start_soon(observer)
        with anyio.fail_after(5):
            while len(ws.frames) < 3:
                await anyio.lowlevel.checkpoint()
        tg.cancel_scope.cancel()
    # 0 would mean a turn of the loop before the first send (the latency this avoids); 3 would mean
    # a backlog sent without ever yielding.
    assert seen == [1]
    assert [json.loads(f)["events"][0]["seq"] for f in ws.frames] == [1, 2, 3]
