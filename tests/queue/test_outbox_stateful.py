"""Hypothesis stateful test of the outbox and its one writer against a model (issue 19 items 1, 7).

The outbox runs with its writer task on an event loop in a thread (a blocking portal), so commits
happen in the background as in the driver. Rules: admit lossless events (some as a command's
`command.finished`, carrying its terminal status), send a batch and receipt part of it, and crash:
the writer task is cancelled (a commit in its worker thread finishes or never began) and a new process
opens the journal with epoch + 1. After each crash:
- the durable events of the dead epoch are a PREFIX of what it admitted (receipted ones may be gone);
- a command's terminal status is durable exactly when its `command.finished` is (one transaction);
- every admission that had returned with a status is durable;
- `last_command_seq` never counts a command whose fact is not durable.
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
from anyio.from_thread import BlockingPortal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from driver.protocol.frames import Receipt
from driver.queue import outbox_writer
from driver.queue.command_index import StoredCommand
from driver.queue.journal import Journal
from driver.queue.outbox import Outbox

INSTANCE = "drv-model"


class OutboxMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "j.sqlite3"
        self.cm: AbstractContextManager[BlockingPortal] = anyio.from_thread.start_blocking_portal()
        self.portal = self.cm.__enter__()
        # Small commits, so a crash lands between the chunks of a burst (and between a status's fact
        # and the events before it) as it does under a flood with the real 1024.
        self._chunk, outbox_writer.COMMIT_MAX_EVENTS = outbox_writer.COMMIT_MAX_EVENTS, 8
        self.epoch = 0
        self.next_cmd = 1
        self.facts: dict[int, str] = {}  # fact seq -> command_id, over the whole life
        self.receipted: set[int] = set()
        self.returned: set[int] = set()  # fact seqs whose admission returned (durable by contract)
        self._open()

    def _open(self) -> None:
        self.epoch += 1
        self.journal = Journal(self.path, synchronous="OFF")
        self.box: Outbox = self.portal.call(self._make)
        self.admitted: list[int] = []  # this epoch's lossless seqs, in admission order
        self.scope: anyio.CancelScope | None = None
        self.writer: Future[Any] = self.portal.start_task_soon(self._writer)

    async def _make(self) -> Outbox:
        box = Outbox(self.journal, INSTANCE, "ses", self.epoch)
        box.on_link_up()
        return box

    async def _writer(self) -> None:
        with anyio.CancelScope() as self.scope:
            await self.box.run()

    def _stop_writer(self) -> None:
        while self.scope is None:  # the task has not begun yet
            self.portal.call(anyio.sleep, 0)
        self.portal.call(self.scope.cancel)
        self.writer.result(timeout=30)

    def teardown(self) -> None:
        self._stop_writer()
        self.journal.close()
        self.cm.__exit__(None, None, None)
        self.dir.cleanup()
        outbox_writer.COMMIT_MAX_EVENTS = self._chunk

    # -- rules ------------------------------------------------------------------------------------------
    @rule(n=st.integers(1, 40))
    def admit(self, n: int) -> None:
        async def go() -> None:
            for _ in range(n):
                eid = await self.box.admit("message.completed", b'{"m":1}', "lossless", None)
                self.admitted.append(int(eid.rsplit("/", 1)[1]))

        self.portal.call(go)

    @rule()
    def finish_a_command(self) -> None:
        cid, seq = f"c{self.next_cmd}", self.next_cmd
        self.next_cmd += 1
        status = StoredCommand(cid, seq, "fp", "completed", b"{}", "input.start")
        payload = json.dumps({"command_id": cid, "command_kind": "input.start", "status": "completed"}).encode()

        async def go() -> int:
            await self.box.save_status(StoredCommand(cid, seq, "fp", "accepted", None, "input.start"))
            eid = await self.box.admit("command.finished", payload, "lossless", None, status)
            return int(eid.rsplit("/", 1)[1])

        fact = self.portal.call(go)
        self.admitted.append(fact)
        self.facts[fact] = cid
        self.returned.add(fact)

    @rule(fraction=st.floats(0.0, 1.0))
    def send_and_receipt(self, fraction: float) -> None:
        batch = self.portal.call(self._take)
        if batch is None:
            return
        events = [json.loads(b) for b in batch.frame_events]
        accepted = [e["event_id"] for e in events[: int(len(events) * fraction)]]
        self.portal.call(self._receipt, Receipt(batch=batch.number, accepted=accepted, rejected=[]))
        self.receipted.update(int(i.rsplit("/", 1)[1]) for i in accepted)

    async def _take(self) -> Any:
        return self.box.take_batch(64, 1 << 20)

    async def _receipt(self, receipt: Receipt) -> None:
        self.box.on_receipt(receipt)

    @rule()
    def crash(self) -> None:
        self._stop_writer()
        self.journal.close()
        before = list(self.admitted)
        self._open()
        durable = {p.seq for p in self.journal.pending()}
        # The prefix: everything up to the newest durable (or receipted: sent only once durable) seq of
        # the dead epoch is durable or was receipted; nothing after it is.
        known = [i for i, s in enumerate(before) if s in durable or s in self.receipted]
        k = known[-1] + 1 if known else 0
        for s in before[:k]:
            assert s in durable or s in self.receipted, f"seq {s} lost below durable seq {before[k - 1]}"
        assert not [s for s in before[k:] if s in durable], "a newer event is durable without an older one"
        for fact, cid in self.facts.items():
            if fact not in before:
                continue
            stored = self.journal.command(cid)
            fact_durable = fact in before[:k]
            assert (stored is not None and stored.status == "completed") == fact_durable, (cid, fact, stored)
            if fact in self.returned:
                assert fact_durable, f"{cid}'s admission returned but its fact {fact} is not durable"

    @invariant()
    def counted_commands_have_durable_facts(self) -> None:
        last = self.journal.last_command_seq()
        durable = {p.seq for p in self.journal.pending()} | self.receipted
        by_cmd = {cid: fact for fact, cid in self.facts.items()}
        for seq in range(1, last + 1):
            assert by_cmd[f"c{seq}"] in durable, f"last_command_seq {last} counts c{seq} without its fact"


TestOutbox = OutboxMachine.TestCase
TestOutbox.settings = settings(
    max_examples=25, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
