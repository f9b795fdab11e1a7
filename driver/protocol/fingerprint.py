"""A command's content, for the `command.conflict` check (PROTOCOL §3, tolerant reader).

"A command's `command_id`, `kind` and the fields this section names for its kind are its content: a
resend that differs only in fields this protocol does not name is the same command." So the
fingerprint is a hash of exactly those: the table below projects a command onto its kind's named
fields (nested objects too: an attachment is its `name`, `url`, `sha256`, `size`), with each optional
field's default put in when it is absent (a resend that spells out `"reason": ""` is the same
command as one that leaves it out). `seq` and `type` are framing, not content. A kind this driver does
not know keeps every field but those two (it is answered `command.invalid` anyway).

Fingerprints carry a version prefix (`c2:`). One stored by an older driver (a bare hash of the whole
frame) is compared with that older hash of the resend, so an upgrade never turns a resend into a
conflict.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from driver.protocol.frames import NESTED_TOO_DEEPLY

VERSION = "c2:"
FRAMING = frozenset({"type", "seq"})


class Leaf:
    """A field taken as it is (any JSON value), or `default` when absent."""

    def __init__(self, default: Any = None) -> None:
        self.default = default

    def project(self, value: Any) -> Any:
        return value


class Obj(Leaf):
    """An object: only its named fields count."""

    def __init__(self, fields: dict[str, Leaf], default: Any = None) -> None:
        super().__init__(default)
        self.fields = fields

    def project(self, value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # not the shape §3 names: kept whole (the command is invalid anyway)
        return project(self.fields, value)


class ListOf(Leaf):
    """An array whose items are `item`s."""

    def __init__(self, item: Leaf, default: Any = None) -> None:
        super().__init__([] if default is None else default)
        self.item = item

    def project(self, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return [self.item.project(v) for v in value]


def project(fields: dict[str, Leaf], obj: dict[str, Any]) -> dict[str, Any]:
    return {name: spec.project(obj[name]) if name in obj else spec.default for name, spec in fields.items()}


ATTACHMENT = Obj({"name": Leaf(), "url": Leaf(), "sha256": Leaf(), "size": Leaf()})
RUN_INPUT = Obj({"text": Leaf(), "attachments": ListOf(ATTACHMENT)})

# kind → its named fields (§3's table, §3.1, §6.8), with the defaults of the optional ones.
CONTENT: dict[str, dict[str, Leaf]] = {
    "input.start": {"run_id": Leaf(), "input": RUN_INPUT, "queue": Leaf(False), "traceparent": Leaf(None)},
    "turn.cancel": {"run_id": Leaf(), "reason": Leaf("")},
    "permission.resolve": {"request_id": Leaf(), "option_id": Leaf()},
    "host_tool.result": {"call_id": Leaf(), "content": ListOf(Leaf()), "is_error": Leaf(False)},
    "session.reset": {"reason": Leaf("")},
    "session.stop": {"reason": Leaf("")},
    "input.steer": {"run_id": Leaf(), "input": RUN_INPUT},
    "process.start": {
        "process_id": Leaf(),
        "argv": ListOf(Leaf()),
        "cwd": Leaf(None),
        "env": Leaf({}),
        "pty": Leaf(None),
    },
    "process.input": {"process_id": Leaf(), "data": Leaf()},
    "process.resize": {"process_id": Leaf(), "cols": Leaf(), "rows": Leaf()},
    "process.signal": {"process_id": Leaf(), "signal": Leaf()},
    "process.replay": {"process_id": Leaf(), "from_offset": Leaf(0)},
}


def _decode(raw: bytes | str) -> Any:
    try:
        return msgspec.json.decode(raw)
    except RecursionError:
        raise msgspec.DecodeError(NESTED_TOO_DEEPLY) from None


def _hash(value: Any) -> str:
    try:
        canon = msgspec.json.encode(value, order="sorted")
    except RecursionError:
        raise msgspec.DecodeError(NESTED_TOO_DEEPLY) from None
    return hashlib.sha256(canon).hexdigest()


def content(obj: Any) -> Any:
    """The part of a decoded command frame that is its content."""
    if not isinstance(obj, dict):
        return obj
    kind = obj.get("kind")
    fields = CONTENT.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return {k: v for k, v in obj.items() if k not in FRAMING}
    return {"command_id": obj.get("command_id"), "kind": kind, **project(fields, obj)}


def fingerprint(raw: bytes | str) -> str:
    """The versioned content hash of a command frame (msgspec.DecodeError for one that is not JSON)."""
    return VERSION + _hash(content(_decode(raw)))


def legacy_fingerprint(raw: bytes | str) -> str:
    """What drivers before `c2` stored: a hash of the whole frame, keys sorted."""
    return _hash(_decode(raw))


def comparable(raw: bytes | str, current: str, known: str | None) -> str:
    """The fingerprint of `raw` to compare with `known`, the one stored for its command_id: `current`
    (its `fingerprint`) unless `known` was stored by an older driver."""
    if known is None or known.startswith(VERSION):
        return current
    return legacy_fingerprint(raw)
