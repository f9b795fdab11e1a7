"""File names on the wire (PROTOCOL §9): a name that is not UTF-8 is still reported, never a crash.

Python reads a file name that is not valid UTF-8 as a `str` with lone surrogates (PEP 383), which no
JSON encoder accepts. Such a name is carried as text with every undecodable byte written `\\xNN`
(lower-case hex, as Python's `backslashreplace`), and `path_b64` beside it holds the raw bytes
(standard base64), so the control plane can show the name and still name the exact file. A name that
is valid UTF-8 has no `path_b64`: its absence says the `path` is the name itself.
"""

from __future__ import annotations

import base64
import contextlib
import os
from typing import Any

PATH_B64 = "path_b64"


def is_clean(name: str) -> bool:
    """True when `name` encodes as UTF-8 (no lone surrogate from an undecodable byte)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escaped(name: str) -> str:
    """`name` as UTF-8 text, each byte that is not UTF-8 written `\\xNN`."""
    if is_clean(name):
        return name
    try:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        # A surrogate that no undecodable byte gives (text from elsewhere): written `\udNNN`.
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def carry(entry: dict[str, Any], key: str = "path") -> dict[str, Any]:
    """`entry` with its `key` escaped and, when the name was not UTF-8, `path_b64` added (a copy)."""
    name = entry.get(key)
    if not isinstance(name, str) or is_clean(name):
        return entry
    out = dict(entry)
    out[key] = escaped(name)
    with contextlib.suppress(UnicodeEncodeError):  # not a file system name: no raw bytes to give
        out[PATH_B64] = base64.b64encode(os.fsencode(name)).decode("ascii")
    return out


def scrub(value: Any) -> Any:
    """Any lone surrogate anywhere in `value` (nested dicts and lists) escaped, so that an encoder
    never fails on it. The last line of defence for fields that are not file names."""
    if isinstance(value, str):
        return escaped(value)
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    return value


def validated(kind: str, payload: dict[str, Any]) -> bytes:
    """`validate_payload`, with any lone surrogate that is still in the payload (text a provider's
    own JSON decoder let through, not a file name) escaped instead of failing the encoder."""
    from driver.protocol.events import validate_payload

    try:
        return validate_payload(kind, payload)
    except UnicodeEncodeError:
        return validate_payload(kind, scrub(payload))
