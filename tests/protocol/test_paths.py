"""File names that are not UTF-8 on the wire (driver.protocol.paths, PROTOCOL §9)."""

from __future__ import annotations

import base64
import os

import msgspec

from driver.protocol.events import validate_payload
from driver.protocol.paths import carry, escaped, is_clean, scrub

RAW = b"outputs/r\xe9sum\xe9 \xff.txt"  # Latin-1 bytes: not UTF-8
NAME = os.fsdecode(RAW)


def test_a_name_that_is_not_utf8_is_escaped_with_its_bytes_beside() -> None:
    assert not is_clean(NAME)
    assert escaped(NAME) == "outputs/r\\xe9sum\\xe9 \\xff.txt"
    out = carry({"path": NAME, "size": 1, "sha256": "0" * 64})
    assert out["path"] == escaped(NAME)
    assert base64.b64decode(out["path_b64"]) == RAW
    body = validate_payload("artifact.produced", out)
    assert msgspec.json.decode(body)["path_b64"] == out["path_b64"]


def test_a_utf8_name_is_kept_and_carries_no_path_b64() -> None:
    entry = {"path": "outputs/résumé ✓.txt", "change": "created"}
    assert carry(entry) is entry
    body = validate_payload("file.changed", {**entry, "sha256": None})
    assert b"path_b64" not in body
    # Text that merely looks like an escape is a name like any other: no path_b64 says so.
    assert carry({"path": "a\\xff"}) == {"path": "a\\xff"}


def test_scrub_escapes_surrogates_anywhere() -> None:
    assert scrub({"a": [NAME, {NAME: 1}], "n": 2}) == {"a": [escaped(NAME), {escaped(NAME): 1}], "n": 2}
    msgspec.json.encode(scrub({"x": NAME}))  # encodes


def test_a_surrogate_no_byte_gives_is_escaped_too() -> None:
    odd = "a\ud800b"
    assert escaped(odd) == "a\\ud800b"
    assert carry({"path": odd}) == {"path": "a\\ud800b"}


def test_a_payload_with_a_lone_surrogate_still_validates() -> None:
    from driver.protocol.paths import validated

    body = validated("message.completed", {"message_id": "m", "role": "assistant", "text": "a\ud800b"})
    assert msgspec.json.decode(body)["text"] == "a\\ud800b"
