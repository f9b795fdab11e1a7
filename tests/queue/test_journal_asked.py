"""The permission requests a run has open, journaled with their events (PROTOCOL §8.2, driver/queue/asked.py):
a successor that reattaches learns the request_ids the CP saw, and only those that became durable."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from driver.queue.asked import Asked
from driver.queue.journal import Journal, JournaledEvent

OPTIONS = [
    {"option_id": "ok", "kind": "allow_once", "label": "Yes"},
    {"option_id": "no", "kind": "reject_once", "label": "No"},
]


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "state" / "driver" / "journal.sqlite3", synchronous="OFF")
    yield j
    j.close()


def event(seq: int, kind: str, run_id: str, payload: dict[str, Any], epoch: int = 1) -> JournaledEvent:
    body = {"event_id": f"drv/{epoch}/{seq:06d}", "seq": seq, "epoch": epoch, "kind": kind, "run_id": run_id}
    return JournaledEvent(seq, f"drv/{epoch}/{seq:06d}", run_id, kind, json.dumps(body | {"payload": payload}).encode())


def requested(seq: int, request_id: str, tool: str, run_id: str = "run-1", epoch: int = 1) -> JournaledEvent:
    payload = {
        "request_id": request_id,
        "tool_call_id": tool,
        "title": "t",
        "options": OPTIONS,
        "expires_at": "2026-12-01T10:00:00.000Z",
    }
    return event(seq, "permission.requested", run_id, payload, epoch)


def resolved(seq: int, request_id: str, outcome: str, option_id: str | None, run_id: str = "run-1") -> JournaledEvent:
    payload = {"request_id": request_id, "outcome": outcome, "option_id": option_id, "decided_by": "control_plane"}
    return event(seq, "permission.resolved", run_id, payload)


def test_open_and_decided_requests_survive_a_reopen_and_go_with_the_terminal(journal: Journal) -> None:
    journal.run_started("run-1", "cmd-1", "2026-12-01T09:00:00.000Z")
    journal.commit([requested(1, "prm-1-1", "tool-a"), requested(2, "prm-1-2", "tool-b")], ())
    journal.commit([resolved(3, "prm-1-1", "allowed", "ok")], [1, 2])  # receipted: the records stay
    j = Journal(journal.path, synchronous="OFF")
    journal.close()
    options = (("ok", "allow_once"), ("no", "reject_once"))
    assert j.asked_permissions("run-1") == [
        Asked("prm-1-1", "tool-a", "2026-12-01T10:00:00.000Z", 1, "allowed", "ok", "control_plane", options),
        Asked("prm-1-2", "tool-b", "2026-12-01T10:00:00.000Z", 1, None, None, None, options),
    ]
    # Another run's requests, one whose id starts with this one's, are not this run's.
    j.commit([requested(4, "prm-1-3", "tool-c", run_id="run-1/x")], ())
    assert [a.request_id for a in j.asked_permissions("run-1")] == ["prm-1-1", "prm-1-2"]
    j.commit([event(5, "run.completed", "run-1", {})], ())
    assert j.asked_permissions("run-1") == []
    assert [a.request_id for a in j.asked_permissions("run-1/x")] == ["prm-1-3"]
    j.close()


def test_a_resolution_of_an_unknown_request_or_a_malformed_body_records_nothing(journal: Journal) -> None:
    journal.commit([resolved(1, "prm-9-9", "allowed", "ok")], ())
    bad = JournaledEvent(2, "drv/1/000002", "run-1", "permission.requested", b'{"payload": 3}')
    journal.commit([bad], ())
    assert journal.asked_permissions("run-1") == []


def test_an_edited_record_is_set_aside_not_adopted(journal: Journal) -> None:
    journal.commit([requested(1, "prm-1-1", "tool-a")], ())
    path = journal.path
    journal.close()
    db = sqlite3.connect(path)
    db.execute("UPDATE texts SET value = replace(value, 'tool-a', 'tool-z') WHERE key LIKE 'permission/%'")
    db.commit()
    db.close()
    j = Journal(path, synchronous="OFF")
    assert j.asked_permissions("run-1") == []
    assert [(f.table, f.reason) for f in j.take_findings()] == [("texts", "mac")]
    j.close()


def test_host_calls_are_open_from_their_call_to_their_resolution(journal: Journal) -> None:
    called = {"run_id": "run-1", "name": "lookup", "arguments": {}}
    journal.commit([event(1, "host_tool.called", "run-1", called | {"call_id": "htc-1-1"})], ())
    journal.commit([event(2, "host_tool.called", "run-1", called | {"call_id": "htc-1-2"})], ())
    journal.commit([event(3, "host_tool.resolved", "run-1", {"call_id": "htc-1-1", "outcome": "completed"})], [1, 2])
    j = Journal(journal.path, synchronous="OFF")
    journal.close()
    assert j.open_host_calls() == ["htc-1-2"]
    j.commit([event(4, "run.failed", "run-1", {})], ())  # a run's end does not settle a call: its resolution does
    assert j.open_host_calls() == ["htc-1-2"]
    j.commit([event(5, "host_tool.resolved", "run-1", {"call_id": "htc-1-2", "outcome": "cancelled"})], ())
    assert j.open_host_calls() == []
    j.close()
