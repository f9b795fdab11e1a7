"""Hypothesis stateful test of the journal against a model (issue 19 item 7, PROTOCOL §3, §4.1, §9).

Rules: commit a transaction (events, command statuses, deletions) that succeeds or dies inside (rolled
back: nothing of it is durable), reopen (a crash between transactions), an agent editing an event row
or a status row with sqlite3. Invariants after every step: the pending events are exactly the model's,
their bodies read back unless tampered (then reported, never returned), every command's stored status
is the model's, and `last_command_seq` is the model's contiguous terminal prefix.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from driver.queue import journal_rows
from driver.queue.command_index import TERMINAL, StoredCommand
from driver.queue.journal import Journal
from driver.queue.rowmac import RowMac, derive_key

MAC = RowMac(derive_key("tok", "drv-model"))


class Boom(Exception):
    pass


class DieInside:
    """A crash point that raises inside the transaction (the in-process stand-in for SIGKILL there)."""

    armed = True

    def reached(self, where: str, *_: bool) -> None:
        if where == "inside":
            raise Boom


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory()
        self.path = Path(self.dir.name) / "j.sqlite3"
        self.journal = Journal(self.path, synchronous="OFF", mac=MAC)
        self.next_seq = 1
        self.events: dict[int, bytes] = {}  # pending, as the model has them
        self.tampered: set[int] = set()  # pending rows an agent edited (never to be read back)
        self.statuses: dict[str, tuple[int, str]] = {}  # command_id -> (seq, status)
        self.bad_commands: set[str] = set()  # status rows an agent edited (gone at the next open)
        self.next_cmd = 1

    def teardown(self) -> None:
        self.journal.close()
        self.dir.cleanup()

    @rule(
        n_events=st.integers(0, 4),
        n_status=st.integers(0, 3),
        terminal=st.booleans(),
        deletes=st.integers(0, 3),
        dies=st.booleans(),
    )
    def commit(self, n_events: int, n_status: int, terminal: bool, deletes: int, dies: bool) -> None:
        rows = []
        for _ in range(n_events):
            seq = self.next_seq
            self.next_seq += 1
            rows.append((seq, f"drv-model/1/{seq:06d}", None, "message.completed", b'{"n":%d}' % seq))
        statuses = []
        cmd_ids = sorted(self.statuses, key=lambda c: self.statuses[c][0])
        for i in range(n_status):
            if cmd_ids and i % 2 == 1:
                cid = cmd_ids[-1]
                seq = self.statuses[cid][0]
            else:
                cid, seq = f"c{self.next_cmd}", self.next_cmd
            status = "completed" if terminal else "accepted"
            statuses.append(StoredCommand(cid, seq, "fp", status, b"{}", "input.start"))
        gone = sorted(s for s in self.events if s not in self.tampered)[:deletes]
        saved = journal_rows.CRASH
        if dies:
            journal_rows.CRASH = DieInside()  # type: ignore[assignment]
        try:
            self.journal.commit(rows, gone, 0, statuses)
        except Boom:
            assert dies
            return  # rolled back: the model does not change (seqs are not reused: next_seq moved on)
        finally:
            journal_rows.CRASH = saved
        for r in rows:
            self.events[r[0]] = r[4]
        for s in gone:
            del self.events[s]
        for c in statuses:
            # The driver's own write replaces an edited row with a valid one.
            self.bad_commands.discard(c.command_id)
            first = self.statuses.get(c.command_id)
            self.statuses[c.command_id] = (first[0] if first else c.seq, c.status)
            if c.seq == self.next_cmd:
                self.next_cmd += 1

    @rule()
    def reopen(self) -> None:
        self.journal.close()
        self.journal = Journal(self.path, synchronous="OFF", mac=MAC)
        for cid in self.bad_commands:
            self.statuses.pop(cid, None)  # set aside at open
        self.bad_commands.clear()

    @precondition(lambda self: bool(set(self.events) - self.tampered))
    @rule(data=st.data())
    def agent_edits_an_event(self, data: st.DataObject) -> None:
        seq = data.draw(st.sampled_from(sorted(set(self.events) - self.tampered)))
        db = sqlite3.connect(self.path)
        db.execute("UPDATE outbox SET body = ? WHERE seq = ?", (b'{"forged":true}', seq))
        db.commit()
        db.close()
        self.tampered.add(seq)

    @precondition(lambda self: bool(self.statuses))
    @rule(data=st.data())
    def agent_edits_a_status(self, data: st.DataObject) -> None:
        cid = data.draw(st.sampled_from(sorted(self.statuses)))
        db = sqlite3.connect(self.path)
        forged = "accepted" if self.statuses[cid][1] == "completed" else "completed"  # a real change
        db.execute("UPDATE commands SET status = ? WHERE command_id = ?", (forged, cid))
        db.commit()
        db.close()
        self.bad_commands.add(cid)

    @invariant()
    def pending_and_bodies_match(self) -> None:
        assert [p.seq for p in self.journal.pending()] == sorted(self.events)
        good, bad = self.journal.bodies(sorted(self.events))
        assert set(bad) == self.tampered & set(self.events)
        assert good == {s: b for s, b in self.events.items() if s not in self.tampered}

    @invariant()
    def statuses_match(self) -> None:
        for cid, (seq, status) in self.statuses.items():
            if cid in self.bad_commands:
                continue  # edited since the last open: the mirror still has the driver's own view
            stored = self.journal.command(cid)
            assert stored is not None and (stored.seq, stored.status) == (seq, status)
        by_seq = {seq: status for seq, status in self.statuses.values()}
        last = 0
        while by_seq.get(last + 1) in TERMINAL:
            last += 1
        if not self.bad_commands:
            assert self.journal.last_command_seq() == last


TestJournal = JournalMachine.TestCase
TestJournal.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
