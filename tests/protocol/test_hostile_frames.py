"""Inputs that used to escape the decoders as exceptions other than their documented ones (issue 11):
JSON nested a thousand levels deep and integers beyond 64 bits where a seq, batch or bound is expected.
Each must be a `FrameError` / `CommandInvalid` naming the problem, never a RecursionError or a number
that later overflows SQLite or a timer."""

from __future__ import annotations

import msgspec
import pytest

from driver.protocol import commands as cmds
from driver.protocol.frames import FrameError, decode_inbound

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


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        (command(seq=HUGE), "seq"),
        (b'{"type":"receipt","batch":' + HUGE + b"}", "batch"),
        (b'{"type":"welcome","connection_id":"c","heartbeat_interval_ms":' + HUGE + b"}", "heartbeat_interval_ms"),
        (b'{"type":"welcome","connection_id":"c","max_batch_events":' + HUGE + b"}", "max_batch_events"),
    ],
)
def test_out_of_range_integers_are_refused(frame: bytes, field: str) -> None:
    with pytest.raises(FrameError, match=field):
        decode_inbound(frame)


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
