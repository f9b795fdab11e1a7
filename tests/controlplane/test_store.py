"""The SQLite store and the event admission check, without a server."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from agent_lab.controlplane.store import CommandExists, Store
from agent_lab.controlplane.validation import InvalidEvent, ValidEvent, check_event

from tests.controlplane.client import INSTANCE, event


def valid(seq: int, kind: str = "message.delta", **kw: object) -> ValidEvent:
    checked = check_event(json.dumps(event(seq, kind, **kw)).encode())  # type: ignore[arg-type]
    assert isinstance(checked, ValidEvent), checked
    return checked


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "s.db")


def test_store_is_wal_with_full_sync(store: Store) -> None:
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    db.close()


def test_insert_is_idempotent_and_ordered_by_seq(store: Store) -> None:
    first = store.insert_events(INSTANCE, [valid(3), valid(1)])
    assert first.accepted == [valid(3).event_id, valid(1).event_id]
    assert [e.seq for e in first.stored] == [3, 1]
    again = store.insert_events(INSTANCE, [valid(1), valid(2)])
    assert again.accepted == [valid(1).event_id, valid(2).event_id]
    assert [e.seq for e in again.stored] == [2]  # only the new one is announced
    assert [e["seq"] for e in store.events(INSTANCE)] == [1, 2, 3]
    assert store.count_events(INSTANCE) == 3
    assert store.events(INSTANCE, after_seq=1, limit=1)[0]["seq"] == 2


def test_same_event_id_in_another_instance_is_another_event(store: Store) -> None:
    store.insert_events(INSTANCE, [valid(1)])
    assert store.insert_events("drv-other", [valid(1)]).stored != []
    assert store.count_events() == 2


def test_epochs_never_go_back_and_survive_reopen(store: Store, tmp_path: Path) -> None:
    assert store.observe_epoch(INSTANCE, 2).allowed
    assert store.observe_epoch(INSTANCE, 2).allowed  # the same process reconnecting
    verdict = store.observe_epoch(INSTANCE, 1)
    assert (verdict.allowed, verdict.highest) == (False, 2)
    store.close()
    reopened = Store(tmp_path / "s.db")
    assert reopened.highest_epoch(INSTANCE) == 2
    reopened.terminate(INSTANCE)
    assert reopened.observe_epoch(INSTANCE, 3).terminated


def test_commands_seq_terminal_and_pending(store: Store) -> None:
    a = store.add_command(INSTANCE, "session.reset", {"reason": "a"})
    b = store.add_command(INSTANCE, "session.reset", {"reason": "b"}, command_id="cmd-b")
    c = store.add_command(INSTANCE, "session.reset", {"reason": "c"})
    assert [a["seq"], b["seq"], c["seq"]] == [1, 2, 3]
    assert b["body"] == {"type": "command", "command_id": "cmd-b", "seq": 2, "kind": "session.reset", "reason": "b"}
    with pytest.raises(CommandExists):
        store.add_command(INSTANCE, "session.reset", {}, command_id="cmd-b")
    assert store.record_update(INSTANCE, a["command_id"], "completed", {}, None)
    assert not store.record_update(INSTANCE, a["command_id"], "failed", None, {"code": "x"})
    assert store.record_update(INSTANCE, "cmd-b", "accepted", None, None)
    assert not store.record_update("drv-other", c["command_id"], "completed", None, None)  # not its command
    assert store.command(a["command_id"])["status"] == "completed"  # type: ignore[index]
    assert [x["command_id"] for x in store.pending_commands(INSTANCE, 0)] == ["cmd-b", c["command_id"]]
    assert [x["command_id"] for x in store.pending_commands(INSTANCE, 2)] == [c["command_id"]]
    assert [u["status"] for u in store.command_updates(a["command_id"])] == ["completed", "failed"]


def test_check_event_accepts_a_good_event_and_canonicalises_the_payload() -> None:
    raw = json.dumps(event(1, "message.completed", extra_field="tolerated")).encode()
    checked = check_event(raw)
    assert isinstance(checked, ValidEvent)
    assert json.loads(checked.payload_json) == {"message_id": "msg-1", "role": "assistant", "text": "all"}


@pytest.mark.parametrize(
    ("raw", "event_id", "named"),
    [
        (b"not json", None, "not JSON"),
        (b"[1]", None, "object"),
        (b'{"kind": "run.started"}', None, "event_id"),
        (json.dumps({**event(1), "epoch": 0}).encode(), event(1)["event_id"], "epoch"),
    ],
)
def test_check_event_rejections(raw: bytes, event_id: str | None, named: str) -> None:
    checked = check_event(raw)
    assert isinstance(checked, InvalidEvent)
    assert checked.event_id == event_id
    assert named in checked.message


TIMING = {"phase": "first_token", "ms": 12.5, "mode": "warm", "run_id": "run-1"}
RECORDS = {"records": [{"at": "2026-11-29T10:00:01.250Z", "level": "info", "logger": "driver.link", "message": "x"}]}


@pytest.mark.parametrize(
    ("kind", "payload", "delivery", "named"),
    [
        ("runtime.timing.recorded", TIMING, "lossless", None),
        ("runtime.timing.recorded", {**TIMING, "phase": "lunch"}, "lossless", "phase"),
        ("runtime.timing.recorded", {**TIMING, "mode": "tepid"}, "lossless", "mode"),
        ("runtime.timing.recorded", TIMING, "best_effort", "delivery"),
        ("log.records", RECORDS, "best_effort", None),
        ("log.records", {**RECORDS, "dropped": 3}, "best_effort", None),
        ("log.records", RECORDS, "lossless", "delivery"),
        ("log.records", {"records": [{"level": "info"}]}, "best_effort", "at"),
    ],
)
def test_check_event_knows_the_telemetry_kinds(
    kind: str, payload: dict[str, object], delivery: str, named: str | None
) -> None:
    checked = check_event(json.dumps(event(1, kind, payload=payload, delivery=delivery, run_id=None)).encode())
    if named is None:
        assert isinstance(checked, ValidEvent), checked
    else:
        assert isinstance(checked, InvalidEvent) and named in checked.message, checked
