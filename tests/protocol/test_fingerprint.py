"""The command content of PROTOCOL §3 (driver.protocol.fingerprint): only command_id, kind and the
fields named for the kind count; defaults are filled in; framing and unknown fields do not count."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from driver.protocol import commands as cmds
from driver.protocol.fingerprint import VERSION, comparable, content, fingerprint, legacy_fingerprint

ATT = {"name": "a.txt", "url": "file:///a", "sha256": "0" * 64, "size": 3}
START: dict[str, Any] = {
    "type": "command",
    "command_id": "cmd-1",
    "seq": 4,
    "kind": "input.start",
    "run_id": "run-1",
    "input": {"text": "hi", "attachments": [ATT]},
}


def fp(obj: dict[str, Any]) -> str:
    return fingerprint(json.dumps(obj))


def test_unknown_fields_framing_order_and_spelled_out_defaults_are_the_same_command() -> None:
    base = fp(START)
    assert base.startswith(VERSION)
    same = [
        {**START, "x_extra": {"deep": [1, 2]}},
        {**START, "input": {**START["input"], "x_note": "n"}},
        {**START, "input": {**START["input"], "attachments": [{**ATT, "mime": "text/plain"}]}},
        dict(reversed(list(START.items()))),
        {**START, "seq": 99, "type": "command"},
        {**START, "queue": False, "traceparent": None},
    ]
    for variant in same:
        assert fp(variant) == base, variant
    assert cmds.fingerprint(json.dumps(START)) == base


@pytest.mark.parametrize(
    "change",
    [
        {"run_id": "run-2"},
        {"command_id": "cmd-2"},
        {"input": {"text": "other", "attachments": [ATT]}},
        {"input": {"text": "hi", "attachments": [{**ATT, "size": 4}]}},
        {"input": {"text": "hi", "attachments": []}},
        {"queue": True},
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    ],
)
def test_a_named_field_that_differs_is_other_content(change: dict[str, Any]) -> None:
    assert fp({**START, **change}) != fp(START)


def test_each_kind_counts_its_own_fields() -> None:
    cancel = {"command_id": "c", "seq": 1, "kind": "turn.cancel", "run_id": "r"}
    assert fp(cancel) == fp({**cancel, "reason": ""}) == fp({**cancel, "x": 1})
    assert fp(cancel) != fp({**cancel, "reason": "user"})
    tool = {"command_id": "c", "seq": 1, "kind": "host_tool.result", "call_id": "k", "content": [{"type": "text"}]}
    assert fp(tool) == fp({**tool, "is_error": False})
    assert fp(tool) != fp({**tool, "is_error": True})
    # Items of content[] are the CP's own objects: all of their fields count.
    assert fp(tool) != fp({**tool, "content": [{"type": "text", "text": "x"}]})
    proc = {"command_id": "c", "seq": 1, "kind": "process.start", "process_id": "p"}
    assert fp(proc) == fp({**proc, "argv": [], "cwd": None, "env": {}, "pty": None})


def test_an_unknown_kind_keeps_every_field_but_framing() -> None:
    odd = {"type": "command", "command_id": "c", "seq": 1, "kind": "x.y", "a": 1}
    assert content(odd) == {"command_id": "c", "kind": "x.y", "a": 1}
    assert fp(odd) != fp({**odd, "a": 2})
    assert fp(odd) == fp({**odd, "seq": 7})


def test_an_older_stored_fingerprint_is_compared_in_kind() -> None:
    raw = json.dumps(START)
    old = legacy_fingerprint(raw)
    assert not old.startswith(VERSION)
    assert comparable(raw, fingerprint(raw), old) == old
    assert comparable(raw, fingerprint(raw), fingerprint(raw)) == fingerprint(raw)
    assert comparable(raw, fingerprint(raw), None) == fingerprint(raw)
    # With an older hash, the older rule applies: an extra field then still differs (as it did).
    assert comparable(json.dumps({**START, "x": 1}), "", old) != old


def test_not_json_or_nested_too_deeply_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        fingerprint(b"{nope")
    with pytest.raises(msgspec.DecodeError):
        fingerprint(b'{"kind": "x", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
