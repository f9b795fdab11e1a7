import msgspec
import pytest

from driver.protocol.commands import CommandInvalid, InputStart, decode_command, fingerprint


def test_input_start_decodes() -> None:
    raw = b'{"type":"command","command_id":"c1","seq":1,"kind":"input.start","run_id":"r1","input":{"text":"hi"}}'
    cmd = decode_command(raw)
    assert isinstance(cmd, InputStart)
    assert cmd.input.text == "hi"
    assert cmd.input.attachments == []


def test_unknown_kind_is_invalid_and_named() -> None:
    with pytest.raises(CommandInvalid, match="unknown command kind"):
        decode_command(b'{"command_id":"c1","seq":1,"kind":"rm.rf"}')


def test_missing_field_is_named() -> None:
    with pytest.raises(CommandInvalid, match=r"run_id"):
        decode_command(b'{"command_id":"c1","seq":1,"kind":"turn.cancel"}')


def test_fingerprint_ignores_key_order() -> None:
    a = msgspec.json.encode({"a": 1, "b": [1, 2]})
    b = b'{ "b": [1,2], "a": 1 }'
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(a) != fingerprint(b'{"a": 2, "b": [1,2]}')


@pytest.mark.parametrize(
    ("known", "terminal", "expected"),
    [
        (None, None, "new"),
        ("fp-other", None, "conflict"),
        ("fp-other", b'{"status":"completed"}', "conflict"),
        ("fp", None, "still_running"),
        ("fp", b'{"status":"completed"}', "resend_terminal"),
    ],
)
def test_repeat_table(known: str | None, terminal: bytes | None, expected: str) -> None:
    from driver.protocol.commands import classify_repeat

    assert classify_repeat("fp", known, terminal).value == expected
