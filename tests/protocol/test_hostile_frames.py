"""Inputs that used to escape the decoders as exceptions other than their documented ones (issue 11):
JSON nested a thousand levels deep and integers beyond 64 bits where a seq, batch or bound is expected.
Each must be a `FrameError` / `CommandInvalid` naming the problem, never a RecursionError or a number
that later overflows SQLite or a timer."""

from __future__ import annotations

import msgspec
import pytest

from driver.protocol import commands as cmds
from driver.protocol.frames import FrameError, InvalidCommand, Welcome, decode_inbound
from driver.protocol.welcome import RANGES, sanitize

DEEP = b"[" * 1000 + b"]" * 1000
HUGE = b"123456789012345678901234567890"


def command(extra: bytes = b"", seq: bytes = b"1") -> bytes:
    return (
        b'{"type":"command","command_id":"c1","seq":' + seq + b',"kind":"input.start","run_id":"r",'
        b'"input":{"text":"x"}' + extra + b"}"
    )


@pytest.mark.parametrize(
    "frame",
    [
        DEEP,
        command(b',"extra":' + DEEP),
        b'{"type":"welcome","connection_id":"c","accepted_capabilities":' + DEEP + b"}",
        b'{"type":"receipt","batch":1,"accepted":' + DEEP + b"}",
    ],
)
def test_deep_nesting_is_a_frame_error(frame: bytes) -> None:
    # A typed field fails at its first wrong level; an ignored (unknown) field is skipped recursively.
    with pytest.raises(FrameError):
        decode_inbound(frame)


def test_an_out_of_range_receipt_batch_is_refused() -> None:
    with pytest.raises(FrameError, match="batch"):
        decode_inbound(b'{"type":"receipt","batch":' + HUGE + b"}")


@pytest.mark.parametrize("seq", [2**63, 2**64, 10**30, -(2**63) - 1, -(2**70)])
def test_a_command_with_a_seq_outside_int64_is_an_invalid_command_with_its_id(seq: int) -> None:
    """Answered `command.invalid` by the desk (issue 30), never dropped as an unreadable frame."""
    frame = decode_inbound(command(seq=str(seq).encode()))
    assert isinstance(frame, InvalidCommand)
    assert frame.command_id == "c1" and "seq" in frame.problem


@pytest.mark.parametrize("head", [b'"kind":7', b'"seq":"one"', b'"kind":null'])
def test_a_command_without_a_usable_head_is_an_invalid_command_with_its_id(head: bytes) -> None:
    field = head.split(b'"')[1].decode()
    frame = decode_inbound(b'{"type":"command","command_id":"c9","seq":1,"kind":"x",' + head + b"}")
    assert isinstance(frame, InvalidCommand) and frame.command_id == "c9" and field in frame.problem


@pytest.mark.parametrize("frame", [b'{"type":"command","seq":' + HUGE + b"}", b'{"type":"command","command_id":""}'])
def test_a_command_without_a_readable_id_is_a_frame_error(frame: bytes) -> None:
    with pytest.raises(FrameError):
        decode_inbound(frame)


@pytest.mark.parametrize("field", ["heartbeat_interval_ms", "max_batch_events", "max_batch_bytes", "max_event_bytes"])
@pytest.mark.parametrize("value", [2**63, 10**30, -(2**70)])
def test_a_welcome_number_of_any_size_is_read_then_clamped(field: str, value: int) -> None:
    frame = decode_inbound(b'{"type":"welcome","connection_id":"c","%s":%d}' % (field.encode(), value))
    assert isinstance(frame, Welcome)
    sane, clamps = sanitize(frame)
    r = RANGES[field]
    used = getattr(sane, field)
    assert r.low <= used <= r.high and field in [c.field for c in clamps]


def test_command_body_nested_too_deeply_is_invalid() -> None:
    with pytest.raises(cmds.CommandInvalid, match="nested"):
        cmds.decode_command(command(b',"extra":' + DEEP))


def test_attachment_size_beyond_64_bits_is_invalid() -> None:
    frame = (
        b'{"command_id":"c1","seq":1,"kind":"input.start","run_id":"r","input":{"text":"x","attachments":'
        b'[{"name":"a","url":"u","sha256":"' + b"0" * 64 + b'","size":' + HUGE + b"}]}}"
    )
    with pytest.raises(cmds.CommandInvalid, match="size"):
        cmds.decode_command(frame)


def test_fingerprint_of_a_deep_frame_is_a_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        cmds.fingerprint(command(b',"extra":' + DEEP))
