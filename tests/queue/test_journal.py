"""The journal under `state_dir` (PROTOCOL §2.2 epoch, §3 command statuses, §4.1 outbox and runs)."""

from __future__ import annotations

import json
import sqlite3
import stat
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver.queue.journal import Journal, JournaledEvent
from driver.queue.schema import COMMANDS_KEPT, SEQ_BLOCK


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "driver" / "journal.sqlite3"


@pytest.fixture
def journal(path: Path) -> Iterator[Journal]:
    # synchronous=OFF keeps the thousands of writes of the pruning tests fast; durability against power
    # loss is SQLite's job, what is tested here is what survives a reopen.
    j = Journal(path, synchronous="OFF")
    yield j
    j.close()


def reopen(j: Journal) -> Journal:
    j.close()
    return Journal(j.path, synchronous="OFF")


def ev(seq: int, kind: str = "message.completed", run_id: str | None = "run-1") -> JournaledEvent:
    return JournaledEvent(seq, f"drv/1/{seq:06d}", run_id, kind, b'{"seq":%d}' % seq)


def test_files_are_private(journal: Journal, path: Path) -> None:
    journal.append([ev(1)])  # the WAL now holds an event payload
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        assert stat.S_IMODE((path.parent / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_epoch_counts_processes_across_reopen(journal: Journal) -> None:
    assert journal.bump_epoch() == 1
    j = reopen(journal)
    assert j.bump_epoch() == 2
    j = reopen(j)
    assert j.bump_epoch() == 3
    j.close()


def test_seq_reservation_never_reuses_across_reopen(journal: Journal) -> None:
    first, end = journal.reserve_seqs()
    assert (first, end) == (1, 1 + SEQ_BLOCK)
    second = journal.reserve_seqs()
    assert second[0] == end
    j = reopen(journal)
    third = j.reserve_seqs()
    # The block handed out before the restart may have been partly used by best-effort events that were
    # never journaled; the next process must start above all of it.
    assert third[0] >= second[1]
    j.close()


def test_seq_reservation_starts_above_journaled_events(journal: Journal) -> None:
    journal.append([ev(SEQ_BLOCK * 3)])
    first, _ = journal.reserve_seqs()
    assert first == SEQ_BLOCK * 3 + 1


def test_events_survive_reopen_in_seq_order_with_bodies(journal: Journal) -> None:
    journal.append([ev(3), ev(1), ev(2)])
    j = reopen(journal)
    assert [p[0] for p in j.pending()] == [1, 2, 3]
    seq, event_id, run_id, kind, size = next(j.pending())
    assert (seq, event_id, run_id, kind, size) == (1, "drv/1/000001", "run-1", "message.completed", len(b'{"seq":1}'))
    assert j.bodies([2, 3]) == ({2: b'{"seq":2}', 3: b'{"seq":3}'}, [])
    j.delete([1, 3])
    assert [p[0] for p in j.pending()] == [2]
    j.close()


def test_pending_reads_a_large_journal_in_chunks_without_missing_a_row(journal: Journal) -> None:
    # More rows than one read (8192) with gaps, so the chunks' boundaries fall on missing seqs too.
    seqs = [s for s in range(1, 60_000) if s % 7]
    journal.append([ev(s) for s in seqs])
    expected = iter(seqs)
    tracemalloc.start()
    try:
        for row in journal.pending():
            assert row[0] == next(expected)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert next(expected, None) is None, "a row was missed"
    # A restart reads every pending row: one chunk at a time, not all of them at once (~250 bytes a
    # row as Python objects: the 51,000 rows at once peaked at ~15 MiB here, one chunk at ~5 MiB).
    assert peak < 8 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_append_is_idempotent_per_event(journal: Journal) -> None:
    journal.append([ev(1)])
    journal.append([ev(1)])
    assert len(list(journal.pending())) == 1


def test_command_statuses_survive_reopen(journal: Journal) -> None:
    journal.save_command("cmd-1", 1, "fp1", "accepted", None)
    journal.save_command("cmd-1", 1, "fp1", "completed", b'{"status":"completed"}')
    journal.save_command("cmd-2", 2, "fp2", "accepted", None)
    j = reopen(journal)
    one = j.command("cmd-1")
    assert one is not None
    assert (one.seq, one.fingerprint, one.status, one.update_frame) == (
        1,
        "fp1",
        "completed",
        b'{"status":"completed"}',
    )
    assert j.command("cmd-3") is None
    assert [c.command_id for c in j.open_commands()] == ["cmd-2"]
    j.close()


def test_last_command_seq_is_zero_for_none(journal: Journal) -> None:
    assert journal.last_command_seq() == 0


def test_last_command_seq_stops_at_a_non_terminal(journal: Journal) -> None:
    journal.save_command("c1", 1, "f", "completed", None)
    journal.save_command("c2", 2, "f", "accepted", None)
    journal.save_command("c3", 3, "f", "failed", None)
    assert journal.last_command_seq() == 1
    journal.save_command("c2", 2, "f", "cancelled", None)
    assert journal.last_command_seq() == 3


def test_last_command_seq_stops_at_a_gap(journal: Journal) -> None:
    journal.save_command("c1", 1, "f", "completed", None)
    journal.save_command("c2", 2, "f", "completed", None)
    journal.save_command("c4", 4, "f", "completed", None)
    assert journal.last_command_seq() == 2
    journal.save_command("c3", 3, "f", "failed", None)
    assert journal.last_command_seq() == 4


def test_last_command_seq_never_covers_a_command_never_seen(journal: Journal) -> None:
    """Command 1 never arrived: claiming 2 would make the CP skip resending 1 forever."""
    journal.save_command("c2", 2, "f", "completed", None)
    assert journal.last_command_seq() == 0


def test_pruning_keeps_at_least_1024_terminal_statuses(journal: Journal) -> None:
    assert COMMANDS_KEPT >= 1024
    total = COMMANDS_KEPT + 600
    for seq in range(1, total + 1):
        journal.save_command(f"c{seq}", seq, "f", "completed", b"{}")
    kept = [seq for seq in range(1, total + 1) if journal.command(f"c{seq}") is not None]
    # The newest statuses are all kept, and pruning did run (the table does not grow without bound).
    assert kept[-1024:] == list(range(total - 1023, total + 1))
    assert len(kept) >= 1024
    assert journal.command("c1") is None
    # Pruned rows were all terminal, so the contiguous terminal prefix still counts, after a reopen too.
    assert journal.last_command_seq() == total
    j = reopen(journal)
    assert j.last_command_seq() == total
    j.save_command(f"c{total + 2}", total + 2, "f", "completed", b"{}")
    assert j.last_command_seq() == total
    j.close()


def test_pruning_goes_on_above_a_missing_seq_and_never_jumps_the_gap(journal: Journal) -> None:
    """Issue 19 item 6: a seq the CP never sent must not stop pruning (the table would grow for ever),
    and what is pruned above it must not let `last_command_seq` jump over the command never seen."""
    journal.save_command("c1", 1, "f", "completed", b"{}")
    top = COMMANDS_KEPT * 3
    for seq in range(3, top + 1):
        journal.save_command(f"c{seq}", seq, "f", "completed", b"{}")
    assert journal.last_command_seq() == 1  # seq 2 was never seen: the CP must resend it
    assert journal.command("c3") is None  # pruned although above the gap
    count = journal._db.execute("SELECT COUNT(*) FROM commands").fetchone()[0]
    assert count <= COMMANDS_KEPT + 256
    j = reopen(journal)  # the pruned ranges are durable
    assert j.last_command_seq() == 1
    j.save_command("c2", 2, "f", "completed", b"{}")  # the gap is filled: the scan steps over the pruned
    assert j.last_command_seq() == top
    j.close()


def test_pruning_never_removes_a_non_terminal_command(journal: Journal) -> None:
    journal.save_command("c1", 1, "f", "accepted", None)
    for seq in range(2, COMMANDS_KEPT + 600):
        journal.save_command(f"c{seq}", seq, "f", "completed", b"{}")
    assert journal.command("c1") is not None
    assert [c.command_id for c in journal.open_commands()] == ["c1"]


def test_run_terminal_in_append_clears_the_active_run(journal: Journal) -> None:
    journal.run_started("run-1", "cmd-1", "2026-11-29T10:00:00.000Z")
    journal.run_started("run-2", "cmd-2", "2026-11-29T10:00:01.000Z")
    journal.append([ev(1, "message.completed", "run-1")])
    assert [r for r, _ in journal.active_runs()] == ["run-1", "run-2"]
    assert not journal.has_terminal("run-1")
    journal.append([ev(2, "run.failed", "run-1")])
    assert journal.active_runs() == [("run-2", "cmd-2")]
    assert journal.has_terminal("run-1")
    j = reopen(journal)
    assert j.active_runs() == [("run-2", "cmd-2")]
    j.run_ended("run-2")
    assert j.active_runs() == []
    j.close()


CHILD = """
import sys
from pathlib import Path
from driver.queue.journal import Journal, JournaledEvent
j = Journal(Path(sys.argv[1]))
j.bump_epoch()
j.run_started("run-1", "cmd-1", "2026-11-29T10:00:00.000Z")
seq = 0
while True:
    seq += 1
    j.append([JournaledEvent(seq, "drv/1/%06d" % seq, "run-1", "message.completed", b"x" * 100)])
    print(seq, flush=True)  # only after the commit returned
"""


def test_committed_events_survive_a_sigkill(path: Path) -> None:
    """A real process killed mid-stream: every append it saw committed is there for the next one."""
    import subprocess
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2]
    )
    assert child.stdout is not None
    try:
        seen = 0
        while seen < 50:
            line = child.stdout.readline()
            assert line, "the child died before writing"
            seen = int(line)
    finally:
        child.kill()
        child.wait(timeout=10)
    j = Journal(path, synchronous="OFF")
    try:
        seqs = [p[0] for p in j.pending()]
        assert seqs[:seen] == list(range(1, seen + 1))
        assert seqs == list(range(1, len(seqs) + 1)), "a torn or reordered tail"
        assert j.active_runs() == [("run-1", "cmd-1")]
        assert j.bump_epoch() == 2
    finally:
        j.close()


# -- continuity: texts, the transcript, ended runs (PROTOCOL §8, §3) ------------------------------------


def test_transcript_keeps_the_newest_bytes_and_clears(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    for i in range(10):
        j.transcript_append("user" if i % 2 == 0 else "assistant", f"{i}:" + "é" * 500, max_bytes=3000)
    kept = j.transcript()
    # UTF-8 bytes count: each message is ~1002 bytes, so the newest two fit in 3000 and the third does not.
    assert [t.split(":")[0] for _, t in kept] == ["8", "9"]
    assert kept[0][0] == "user" and kept[1][0] == "assistant"
    j.transcript_clear()
    assert j.transcript() == []
    j.close()


def test_texts_survive_a_reopen(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    j.set_text("native_ref", '{"runtime": "acp", "value": "s-1"}')
    j.close()
    j = Journal(tmp_path / "j.sqlite3")
    assert j.text("native_ref") == '{"runtime": "acp", "value": "s-1"}'
    j.set_text("native_ref", None)
    assert j.text("native_ref") is None
    j.close()


def test_a_journaled_terminal_ends_the_run_and_is_remembered(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.sqlite3")
    j.run_started("run-1", "cmd-1", "2026-11-30T00:00:00Z")
    j.run_started("run-2", "cmd-2", "2026-11-30T00:00:01Z")
    body = json.dumps({"payload": {"error": {"code": "provider.crashed", "message": "gone", "retryable": True}}})
    j.append([JournaledEvent(1, "e/1", "run-1", "run.failed", body.encode())])
    assert j.active_runs() == [("run-2", "cmd-2")]
    ended = j.ended_run_of("cmd-1")
    assert ended is not None and ended.terminal == "run.failed" and ended.run_id == "run-1"
    assert ended.error == {"code": "provider.crashed", "message": "gone", "retryable": True}
    assert j.ended_run_of("cmd-2") is None
    j.close()


def test_derived_events_are_counted_in_their_commit_and_authenticated(journal: Journal) -> None:
    """PROTOCOL §8.2 (the keeper): `runs.derived` moves in the writer's transaction that journals the
    events it counts, only for derived kinds, and the `runs` row's MAC covers it."""
    journal.run_started("run-1", "cmd-1", "2026-11-29T10:00:00.000Z")
    journal.run_started("run-2", "cmd-2", "2026-11-29T10:00:01.000Z")
    journal.commit([ev(1, "message.started"), ev(2, "tool.started"), ev(3, "permission.requested")], ())
    journal.commit([ev(4, "message.completed"), ev(5, "usage.updated", "run-2")], [1])
    assert (journal.derived_count("run-1"), journal.derived_count("run-2")) == (3, 1)
    j = reopen(journal)
    assert j.derived_count("run-1") == 3
    j.commit([ev(6, "message.completed"), ev(7, "run.completed")], ())
    assert j.derived_count("run-1") == 4 and j.active_runs() == [("run-2", "cmd-2")]
    # An agent that lowers the count (so that a successor would send journaled events again): the row
    # fails its check, is set aside and reported, and the run is neither active nor counted.
    j.close()
    db = sqlite3.connect(j.path)
    db.execute("UPDATE runs SET derived = 0 WHERE run_id = 'run-2'")
    db.commit()
    db.close()
    j = Journal(j.path, synchronous="OFF")
    assert j.derived_count("run-2") == 0 and j.active_runs() == []
    assert [(f.table, f.key, f.reason) for f in j.take_findings()] == [("runs", "run-2", "mac")]
    j.close()


def test_an_older_journal_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, command_id TEXT NOT NULL, started_at TEXT NOT NULL);"
        "CREATE TABLE commands (command_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, fingerprint TEXT NOT NULL,"
        " status TEXT NOT NULL, update_frame BLOB, touched INTEGER NOT NULL);"
        "INSERT INTO runs VALUES ('run-0', 'cmd-0', '2026-01-01');"
    )
    db.commit()
    db.close()
    j = Journal(path)
    # Rows of a driver before MACs cannot be told from an agent's: set aside and reported, never acted on.
    assert j.active_runs() == []
    assert [(f.table, f.key, f.reason) for f in j.take_findings()] == [("runs", "run-0", "mac")]
    j.save_command("cmd-0", 1, "fp", "accepted", None, "input.start")
    assert j.command_kind("cmd-0") == "input.start"
    j.close()


def test_command_reads_do_not_wait_for_a_commit_in_progress(journal: Journal) -> None:
    """The kernel reads `command()` and `last_command_seq()` on the event loop (`on_command`,
    `hello`): they must answer from memory while a writer holds the connection through its fsync."""
    import threading

    journal.save_command("c1", 1, "fp1", "completed", b'{"frame":1}', "input.start")
    journal.save_command("c2", 2, "fp2", "accepted", None, "turn.cancel")
    answers: list[object] = []
    done = threading.Event()

    def read() -> None:
        answers.extend([journal.command("c1"), journal.command("nope"), journal.last_command_seq()])
        done.set()

    with journal._lock:  # a group commit in progress (its fsync can take seconds on a busy disk)
        threading.Thread(target=read, daemon=True).start()
        assert done.wait(5), "command reads waited for the writer's lock"
    stored, missing, last = answers
    assert stored is not None and stored.status == "completed" and stored.update_frame == b'{"frame":1}'
    assert stored.kind == "input.start" and stored.fingerprint == "fp1" and stored.seq == 1
    assert missing is None
    assert last == 1


def test_memory_mirror_matches_the_database_after_reopen_and_pruning(journal: Journal) -> None:
    n = COMMANDS_KEPT + 600
    for i in range(1, n + 1):
        journal.save_command(f"c{i}", i, f"fp{i}", "accepted", None, "input.start")
        journal.save_command(f"c{i}", i, f"fp{i}", "completed" if i != n - 5 else "accepted", b"{}", None)

    def check(j: Journal) -> None:
        assert j.last_command_seq() == n - 6
        latest, open_one = j.command(f"c{n}"), j.command(f"c{n - 5}")
        assert latest is not None and latest.kind == "input.start"
        assert open_one is not None and open_one.status == "accepted"
        rows = {r[0] for r in j._db.execute("SELECT command_id FROM commands")}
        assert len(rows) < n  # pruning happened
        assert {f"c{i}" for i in range(1, n + 1) if j.command(f"c{i}") is not None} == rows

    check(journal)
    j2 = reopen(journal)
    try:
        check(j2)
    finally:
        j2.close()
