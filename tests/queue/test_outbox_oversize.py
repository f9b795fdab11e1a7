"""PROTOCOL §4.3 in the outbox: a journaled event larger than a frame may be (an older driver's, or
one refused with 1009) is cut to fit and journaled cut, or finally rejected; never resent whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.queue.best_effort import BestEffortBuffer, BestEffortEvent
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox
from tests.queue.test_outbox import INSTANCE, SESSION, Clock, events_of, make, take

pytestmark = pytest.mark.anyio


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


def _tool(size: int, tool_call_id: str = "call-1") -> bytes:
    output = {"content": [{"type": "text", "text": "t" * size}], "lines": ["l"] * 100}
    return json.dumps({"tool_call_id": tool_call_id, "status": "completed", "output": output, "exit_code": 0}).encode()


async def test_a_journaled_event_too_big_for_the_frame_is_cut_and_the_cut_is_journaled(
    journal: Journal, tmp_path: Path
) -> None:
    clock = Clock()
    box = make(journal, clock)
    event_id = await box.admit("tool.completed", _tool(300_000), "lossless", "run-1")
    await box.admit("message.completed", b'{"message_id":"m","role":"assistant","text":"next"}', "lossless", "run-1")
    await box.flush()
    first = take(box, max_bytes=64 * 1024)
    [event] = events_of(first)  # the big one alone, cut: never the whole body
    assert event["event_id"] == event_id
    assert len(first.frame_events[0]) <= 64 * 1024 - 64
    assert event["payload"]["truncated"]["original_bytes"] > 300_000
    assert event["payload"]["tool_call_id"] == "call-1" and event["payload"]["status"] == "completed"
    assert [e["payload"]["text"] for e in events_of(take(box, max_bytes=64 * 1024))] == ["next"]
    # A restart resends the cut bytes, exactly (the CP's digest of a duplicate must match).
    await box.flush()  # the cut is journaled by the one writer
    assert journal.bodies([1]) == ({1: first.frame_events[0]}, [])
    journal.close()
    j2 = Journal(tmp_path / "journal.sqlite3", synchronous="OFF")
    try:
        box2 = Outbox(j2, INSTANCE, SESSION, 2, clock=clock)
        box2.on_link_up()
        assert take(box2, max_bytes=64 * 1024).frame_events[0] == first.frame_events[0]
    finally:
        j2.close()


async def test_an_event_that_cannot_be_cut_is_finally_rejected_locally(journal: Journal) -> None:
    box = make(journal, Clock())
    huge_id = "x" * 20_000  # an identity field: never cut
    bad = await box.admit("tool.completed", _tool(10, tool_call_id=huge_id), "lossless", "run-1")
    good = await box.admit("tool.completed", _tool(10), "lossless", "run-1")
    await box.flush()
    batch = take(box, max_bytes=8 * 1024)
    assert [e["event_id"] for e in events_of(batch)] == [good]
    [final] = box.take_local_rejections()
    assert final.event_id == bad and final.rejection.code == "event.too_large" and not final.rejection.retryable
    assert box.take_local_rejections() == []
    await box.flush()  # the rejected event leaves the journal too
    assert box.pending_count == 1 and journal.bodies([1]) == ({}, [])


def test_a_best_effort_event_larger_than_any_batch_is_dropped_and_counted() -> None:
    buffer = BestEffortBuffer()
    big = BestEffortEvent(1, "e/1/000001", "run-1", "tool.output.delta", b'{"text":"' + b"d" * 9000 + b'"}', "t")
    small = BestEffortEvent(2, "e/1/000002", "run-1", "message.delta", b'{"message_id":"m","text":"s"}', "t")
    buffer.add(big)
    buffer.add(small)
    taken = buffer.take(10, 4096, lambda b: b.encode(1, SESSION))
    assert [b.event_id for b, _ in taken] == ["e/1/000002"]
    assert buffer.dropped_for("run-1") == 1 and buffer.dropped == 1
