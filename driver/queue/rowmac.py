"""Authenticated journal rows (PROTOCOL §4.1, §9): HMAC-SHA256 under a key derived with HKDF.

The agent's tools run as the driver's uid; where the driver's state is reachable (no mount namespace),
they can edit the journal with sqlite3. Every row the driver writes carries a MAC over its table name
and its fields, so a row the driver did not write (inserted, edited, moved to another key) is told
apart and never sent or acted on.

Key: HKDF-SHA256 (RFC 5869) with the control token as input keying material, the fixed salt below and
the instance id in `info`. It is derived once at start and kept only in memory (the process is not
dumpable, driver/containment/undumpable.py). No I/O here.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

HKDF_SALT = b"agent-driver journal v1"
HKDF_INFO = b"agent-driver journal rows\x00"
MAC_BYTES = 32

_NONE = b"\xff"  # a NULL field: distinct from every encoded value (those start with 0x00 or 0x01)
_len = struct.Struct(">Q").pack


def hkdf_sha256(ikm: bytes, salt: bytes, info: bytes, length: int = 32) -> bytes:
    """RFC 5869: HKDF-Extract then HKDF-Expand with SHA-256."""
    if length > 255 * 32:
        raise ValueError("HKDF-SHA256 yields at most 8160 bytes")
    prk = hmac.new(salt or b"\x00" * 32, ikm, hashlib.sha256).digest()
    okm, block, counter = b"", b"", 1
    while len(okm) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        okm += block
        counter += 1
    return okm[:length]


def derive_key(token: str, instance_id: str) -> bytes:
    return hkdf_sha256(token.encode(), HKDF_SALT, HKDF_INFO + instance_id.encode())


Field = str | bytes | int | None


def _encode(table: str, fields: tuple[Field, ...]) -> bytes:
    """An unambiguous encoding: the table, then each field tagged by type and length-prefixed."""
    parts = [table.encode(), b"\x00"]
    for f in fields:
        if f is None:
            parts.append(_NONE)
        elif isinstance(f, bytes):
            parts += (b"\x00", _len(len(f)), f)
        elif isinstance(f, int):  # bool is an int too: stored as 0/1 by SQLite anyway
            parts += (b"\x02", _len(f & 0xFFFFFFFFFFFFFFFF))
        else:
            raw = f.encode("utf-8", "surrogatepass")
            parts += (b"\x01", _len(len(raw)), raw)
    return b"".join(parts)


class RowMac:
    """Computes and checks the MAC of a row. `key` must never be logged or written anywhere."""

    __slots__ = ("_base",)

    def __init__(self, key: bytes) -> None:
        # The keyed state once; each MAC copies it (cheaper than keying per call on the hot path).
        self._base = hmac.new(key, digestmod=hashlib.sha256)

    def _digest(self, msg: bytes) -> bytes:
        h = self._base.copy()
        h.update(msg)
        return h.digest()

    def __repr__(self) -> str:  # never the key
        return "RowMac(<key>)"

    def of(self, table: str, *fields: Field) -> bytes:
        return self._digest(_encode(table, fields))

    def event(self, seq: int, event_id: str, run_id: str | None, kind: str, body: bytes) -> bytes:
        """The outbox row's MAC: the hot path (one call per lossless event, in the writer's thread).
        The same encoding as `of("outbox", ...)`, built in one step."""
        eid, knd = event_id.encode("utf-8", "surrogatepass"), kind.encode("utf-8", "surrogatepass")
        if run_id is None:
            rid = _NONE
        else:
            raw = run_id.encode("utf-8", "surrogatepass")
            rid = b"\x01" + _len(len(raw)) + raw
        msg = b"".join(
            (
                b"outbox\x00\x02",
                _len(seq & 0xFFFFFFFFFFFFFFFF),
                b"\x01",
                _len(len(eid)),
                eid,
                rid,
                b"\x01",
                _len(len(knd)),
                knd,
                b"\x00",
                _len(len(body)),
                body,
            )
        )
        return self._digest(msg)

    def check(self, mac: object, table: str, *fields: object) -> bool:
        """True when `mac` is the MAC of these fields. Fields of a type the driver never writes (an
        agent's TEXT where a BLOB belongs, a REAL) fail, never raise."""
        if not isinstance(mac, bytes) or len(mac) != MAC_BYTES:
            return False
        if not all(f is None or isinstance(f, str | bytes | int) for f in fields):
            return False
        return hmac.compare_digest(mac, self.of(table, *fields))  # type: ignore[arg-type]

    def check_event(
        self, mac: object, seq: object, event_id: object, run_id: object, kind: object, body: object
    ) -> bool:
        if not isinstance(mac, bytes) or len(mac) != MAC_BYTES:
            return False
        if not (
            isinstance(seq, int)
            and isinstance(event_id, str)
            and (run_id is None or isinstance(run_id, str))
            and isinstance(kind, str)
            and isinstance(body, bytes)
        ):
            return False
        return hmac.compare_digest(mac, self.event(seq, event_id, run_id, kind, body))


# Tests and benches that build a Journal directly (never the driver: the kernel always passes the key
# derived from its boot payload).
UNKEYED = RowMac(derive_key("", ""))
