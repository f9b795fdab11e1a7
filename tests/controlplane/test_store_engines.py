"""The store contract (issue 34), run against both engines: SQLite (a file) and PostgreSQL (a fresh
database of a throwaway cluster). Each test drives the `Engine` writes and the `Reads` queries the
control plane uses, and asserts what a receipt and a welcome rely on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_lab.controlplane.engine import Engine, Reads, open_engine
from agent_lab.controlplane.store_rows import CommandExists, Superseded
from agent_lab.controlplane.validation import ValidEvent, check_event

from tests.controlplane.client import INSTANCE, event
from tests.controlplane.test_checkpoints import Feed


def valid(raw: dict[str, Any]) -> ValidEvent:
    checked = check_event(json.dumps(raw).encode())
    assert isinstance(checked, ValidEvent), checked
    return checked


def ev(seq: int, **kw: Any) -> ValidEvent:
    return valid(event(seq, "message.delta", **kw))


class Opened:
    def __init__(self, engine: Engine, reads: Reads) -> None:
        self.engine = engine
        self.reads = reads

    async def store(self, events: list[ValidEvent], generation: int, instance: str = INSTANCE) -> Any:
        return await self.engine.insert_events(instance, generation, events, [])


@pytest.fixture
async def opened(store_url: str) -> AsyncIterator[Opened]:
    engine = open_engine(store_url)
    await engine.start()
    reads = engine.open_reads()
    yield Opened(engine, reads)
    reads.close()
    await engine.close()


async def test_claims_fence_epochs_and_take_a_new_generation_each(opened: Opened, store_url: str) -> None:
    e = opened.engine
    first = await e.claim(INSTANCE, 2)
    again = await e.claim(INSTANCE, 2)  # the same process reconnecting
    assert (first.allowed, again.allowed) == (True, True)
    assert again.generation == first.generation + 1
    older = await e.claim(INSTANCE, 1)
    assert (older.allowed, older.highest, older.terminated) == (False, 2, False)
    assert opened.reads.highest_epoch(INSTANCE) == 2
    assert opened.reads.link_generation(INSTANCE) == again.generation  # a refused claim takes none
    await e.terminate(INSTANCE)
    assert (await e.claim(INSTANCE, 3)).terminated
    reopened = open_engine(store_url)  # durable: another engine (another gateway) sees the same
    await reopened.start()
    try:
        assert (await reopened.claim(INSTANCE, 9)).terminated
        assert (await reopened.claim("drv-other", 1)).allowed
    finally:
        await reopened.close()


async def test_batches_are_idempotent_ordered_and_conflicts_named(opened: Opened) -> None:
    gen = (await opened.engine.claim(INSTANCE, 1)).generation
    first = await opened.store([ev(3), ev(1)], gen)
    assert first.accepted == [ev(3).event_id, ev(1).event_id]
    assert [e.seq for e in first.stored] == [3, 1]
    again = await opened.store([ev(1), ev(2), ev(2)], gen)  # a resend, and a duplicate inside the batch
    assert sorted(again.accepted) == sorted([ev(1).event_id, ev(2).event_id, ev(2).event_id])
    assert [e.seq for e in again.stored] == [2]  # only the new one is announced
    changed = valid(event(1, "message.delta", payload={"message_id": "m", "text": "other"}))
    conflict = await opened.store([changed], gen)
    assert [r.code for r in conflict.rejected] == ["event.conflict"] and conflict.accepted == []
    assert [e["seq"] for e in opened.reads.events(INSTANCE)] == [1, 2, 3]
    assert opened.reads.events(INSTANCE, after_seq=1, limit=1)[0]["seq"] == 2
    assert opened.reads.count_events(INSTANCE) == 3
    other = (await opened.engine.claim("drv-other", 1)).generation
    assert (await opened.store([ev(1)], other, "drv-other")).stored != []  # another instance's event
    assert opened.reads.count_events() == 4


async def test_batches_queued_together_are_stored_once_each_and_answered_each(opened: Opened) -> None:
    """Batches that queue up on one instance's writer are stored together (PostgreSQL: one statement);
    each still gets its own answer: an event in two of them is stored once, a changed one conflicts."""
    gen = (await opened.engine.claim(INSTANCE, 1)).generation
    await opened.store([ev(1)], gen)
    changed = valid(event(2, "message.delta", payload={"message_id": "m", "text": "other"}))
    futures = [
        opened.engine.insert_events(INSTANCE, gen, batch, [])
        for batch in ([ev(1), ev(2)], [ev(2), ev(3)], [changed], [ev(3)])
    ]
    a, b, c, d = await asyncio.gather(*futures)
    assert ([e.seq for e in a.stored], sorted(a.accepted)) == ([2], sorted([ev(1).event_id, ev(2).event_id]))
    assert ([e.seq for e in b.stored], sorted(b.accepted)) == ([3], sorted([ev(2).event_id, ev(3).event_id]))
    assert ([r.code for r in c.rejected], c.accepted, c.stored) == (["event.conflict"], [], [])
    assert (d.stored, d.accepted) == ([], [ev(3).event_id])
    assert [e["seq"] for e in opened.reads.events(INSTANCE)] == [1, 2, 3]
    assert opened.reads.events(INSTANCE)[1]["payload"] == json.loads(ev(2).payload_json)


async def test_a_batch_of_a_superseded_generation_stores_nothing(opened: Opened) -> None:
    old = (await opened.engine.claim(INSTANCE, 1)).generation
    await opened.store([ev(1)], old)
    new = (await opened.engine.claim(INSTANCE, 1)).generation
    with pytest.raises(Superseded):
        await opened.store([ev(2)], old)
    assert [e["seq"] for e in opened.reads.events(INSTANCE)] == [1]
    assert (await opened.store([ev(2)], new)).stored != []


async def test_commands_seq_terminal_pending_and_finished_events(opened: Opened) -> None:
    e, r = opened.engine, opened.reads
    a = await e.add_command(INSTANCE, "session.reset", {"reason": "a"}, None)
    b = await e.add_command(INSTANCE, "session.reset", {"reason": "b"}, "cmd-b")
    c = await e.add_command(INSTANCE, "session.reset", {"reason": "c"}, None)
    assert [a["seq"], b["seq"], c["seq"]] == [1, 2, 3]
    assert r.command("cmd-b") == b
    assert b["body"] == {"type": "command", "command_id": "cmd-b", "seq": 2, "kind": "session.reset", "reason": "b"}
    with pytest.raises(CommandExists):
        await e.add_command(INSTANCE, "session.reset", {}, "cmd-b")
    assert await e.record_update(INSTANCE, a["command_id"], "completed", {}, None)
    assert not await e.record_update(INSTANCE, a["command_id"], "failed", None, {"code": "x"})
    assert not await e.record_update("drv-other", c["command_id"], "completed", None, None)  # not its command
    assert [x["command_id"] for x in r.pending_commands(INSTANCE, 0)] == ["cmd-b", c["command_id"]]
    assert [x["command_id"] for x in r.pending_commands(INSTANCE, 2)] == [c["command_id"]]
    assert [u["status"] for u in r.command_updates(a["command_id"])] == ["completed", "failed"]
    gen = (await e.claim(INSTANCE, 1)).generation
    finished = event(9, "command.finished", run_id=None,
                     payload={"command_id": "cmd-b", "command_kind": "session.reset", "status": "completed",
                              "result": {"ok": 1}})  # fmt: skip
    await opened.store([valid(finished)], gen)
    assert r.command("cmd-b")["status"] == "completed"  # type: ignore[index]
    assert r.command("cmd-b")["result"] == {"ok": 1}  # type: ignore[index]
    assert [c["seq"] for c in r.commands(INSTANCE)] == [1, 2, 3]


async def test_checkpoints_reassemble_and_refuse_a_gap(opened: Opened) -> None:
    gen = (await opened.engine.claim(INSTANCE, 1)).generation
    feed = Feed()
    data = bytes(range(256)) * 40
    result = await opened.store([valid(x) for x in feed.checkpoint({"a.jsonl": data}, limit=2048)], gen)
    assert result.rejected == []
    listed = opened.reads.checkpoints(INSTANCE)
    assert [c["bytes"] for c in listed] == [len(data)]
    assert opened.reads.latest_checkpoint(INSTANCE) == listed[-1]
    assert opened.reads.checkpoint_blob(listed[0]["files"][0]["sha256"]) == data
    gap = Feed()
    gap.seq = 100
    events = gap.checkpoint({"b.jsonl": data}, limit=2048, cid="ckpt-gap")
    refused = await opened.store([valid(x) for x in events[1:]], gen)  # the first chunk is missing
    assert {r.code for r in refused.rejected} == {"checkpoint.incomplete"}
    assert len(opened.reads.checkpoints(INSTANCE)) == 1


async def test_two_claims_behind_a_barrier_leave_one_owner(store_url: str) -> None:
    """Two gateways (two engines) claim the same instance at once: both at the same epoch are allowed
    (a reconnect), with distinct generations; the lower one is fenced, whatever the order."""
    a, b = open_engine(store_url, "gw-a"), open_engine(store_url, "gw-b")
    await a.start()
    await b.start()
    reads = a.open_reads()
    try:
        barrier = asyncio.Barrier(2)

        async def claim(engine: Engine) -> Any:
            await barrier.wait()
            return await engine.claim(INSTANCE, 1)

        va, vb = await asyncio.gather(claim(a), claim(b))
        assert va.allowed and vb.allowed and va.generation != vb.generation
        loser, winner = sorted([(va.generation, a), (vb.generation, b)], key=lambda x: x[0])
        assert reads.link_generation(INSTANCE) == winner[0]
        with pytest.raises(Superseded):
            await loser[1].insert_events(INSTANCE, loser[0], [ev(1)], [])
        await winner[1].insert_events(INSTANCE, winner[0], [ev(1)], [])
        assert reads.count_events(INSTANCE) == 1
    finally:
        reads.close()
        await a.close()
        await b.close()
