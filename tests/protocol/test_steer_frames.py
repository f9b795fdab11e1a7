"""PROTOCOL §3.1 on the wire: `input.steer`, `input.start{queue}`, the `steer` capability's mode,
heartbeats' `queued[]` and the `input.steered` payload."""

from __future__ import annotations

import msgspec
import pytest

from driver.protocol.capabilities import ALL, BY_RUNTIME, STEER_MODE, capability_mode
from driver.protocol.commands import CommandInvalid, InputStart, InputSteer, decode_command
from driver.protocol.events import EVENT_KINDS, PayloadError, validate_payload
from driver.protocol.frames import Capability, Heartbeat, HeartbeatOutbox, encode


def test_input_steer_decodes_and_names_a_bad_field() -> None:
    raw = b'{"command_id":"c1","seq":2,"kind":"input.steer","run_id":"r1","input":{"text":"also this"}}'
    cmd = decode_command(raw)
    assert isinstance(cmd, InputSteer) and cmd.run_id == "r1" and cmd.input.text == "also this"
    with pytest.raises(CommandInvalid, match=r"run_id"):
        decode_command(b'{"command_id":"c1","seq":2,"kind":"input.steer","input":{"text":"x"}}')
    with pytest.raises(CommandInvalid, match=r"input"):
        decode_command(b'{"command_id":"c1","seq":2,"kind":"input.steer","run_id":"r1","input":"x"}')


def test_input_start_queue_is_a_boolean_defaulting_to_false() -> None:
    base = b'{"command_id":"c1","seq":1,"kind":"input.start","run_id":"r1","input":{"text":"hi"}'
    plain = decode_command(base + b"}")
    queued = decode_command(base + b',"queue":true}')
    assert isinstance(plain, InputStart) and plain.queue is False
    assert isinstance(queued, InputStart) and queued.queue is True
    with pytest.raises(CommandInvalid, match=r"queue"):
        decode_command(base + b',"queue":"yes"}')


def test_every_runtime_declares_steer_with_its_mode() -> None:
    assert "steer" in ALL
    for runtime, caps in BY_RUNTIME.items():
        assert "steer" in caps
        assert capability_mode(runtime, "steer") == STEER_MODE[runtime]
        assert capability_mode(runtime, "text_stream") is None
    assert STEER_MODE == {"claude-agent-sdk": "native", "openai-app-server": "native", "acp": "follow_up"}
    # `mode` is on the wire only where it applies.
    assert msgspec.json.decode(encode(Capability("steer", True, "native"))) == {
        "id": "steer",
        "supported": True,
        "mode": "native",
    }
    assert msgspec.json.decode(encode(Capability("usage", True))) == {"id": "usage", "supported": True}


def test_heartbeat_lists_queued_runs() -> None:
    beat = Heartbeat(
        at="t", state="running", run_id="r1", outbox=HeartbeatOutbox(lossless_pending=0, best_effort_dropped=0)
    )
    assert msgspec.json.decode(encode(beat))["queued"] == []
    beat.queued = ["r2", "r3"]
    assert msgspec.json.decode(encode(beat))["queued"] == ["r2", "r3"]


def test_input_steered_is_lossless_run_scoped_and_validated() -> None:
    spec = EVENT_KINDS["input.steered"]
    assert spec.delivery == "lossless" and spec.run_scoped
    ok = {"run_id": "r1", "command_id": "c2", "text": "also this", "mode": "follow_up"}
    validate_payload("input.steered", ok)
    with pytest.raises(PayloadError):
        validate_payload("input.steered", {**ok, "mode": "sideways"})
    with pytest.raises(PayloadError):
        validate_payload("input.steered", {k: v for k, v in ok.items() if k != "command_id"})
