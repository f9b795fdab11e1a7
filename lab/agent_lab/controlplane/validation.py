"""Admission check of one event envelope (PROTOCOL §4), without I/O.

The reference control plane is deliberately strict: it checks the envelope, the delivery class of the
kind and the payload against the same schema the driver's kernel validates with, so a driver bug shows
up as a named `event.invalid` rejection instead of a silently stored malformed event.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated, Any

import msgspec

from driver.protocol.events import EVENT_KINDS, Delivery, PayloadError, split_truncated

MAX_EVENT_ID_CHARS = 512


class _EnvelopeFields(msgspec.Struct, kw_only=True):
    # Unknown envelope fields are tolerated (tolerant reader); required ones are named by msgspec.
    event_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_EVENT_ID_CHARS)]
    seq: Annotated[int, msgspec.Meta(ge=0)]
    epoch: Annotated[int, msgspec.Meta(ge=1)]
    kind: str
    delivery: Delivery
    session_id: str
    run_id: str | None
    occurred_at: Annotated[str, msgspec.Meta(min_length=1)]


class _Envelope(_EnvelopeFields, kw_only=True):
    payload: dict[str, Any]


class _TypedEnvelope(_EnvelopeFields, kw_only=True):
    payload: msgspec.Raw


class ValidEvent(msgspec.Struct, frozen=True, kw_only=True):
    """An event that passed admission, ready to store."""

    event_id: str
    seq: int
    epoch: int
    kind: str
    delivery: str
    session_id: str
    run_id: str | None
    occurred_at: str
    payload_json: str
    digest: str


class InvalidEvent(msgspec.Struct, frozen=True, kw_only=True):
    """`event_id` is None when the object does not even carry a readable id."""

    event_id: str | None
    message: str


_canonical = msgspec.json.Encoder(order="sorted")


def _event_id_of(obj: Any) -> str | None:
    if isinstance(obj, dict):
        value = obj.get("event_id")
        if isinstance(value, str) and 0 < len(value) <= MAX_EVENT_ID_CHARS:
            return value
    return None


_typed = msgspec.json.Decoder(_TypedEnvelope)
_payload_decoders = {kind: msgspec.json.Decoder(spec.payload) for kind, spec in EVENT_KINDS.items()}
_TZ_SUFFIX = ("Z", "+00:00")


def check_event(raw: bytes) -> ValidEvent | InvalidEvent:
    """Validate one encoded event object; never raises for bad input.

    The common case (a well-formed event, as the driver sends) takes a typed fast path: one decode
    into the envelope, one typed decode of the payload. Anything that fails it is checked again by
    the slow path, whose messages name the problem."""
    try:
        env = _typed.decode(raw)
        spec = EVENT_KINDS[env.kind]
        if env.delivery == spec.delivery and env.occurred_at.endswith(_TZ_SUFFIX):
            datetime.fromisoformat(env.occurred_at)
            _payload_decoders[env.kind].decode(env.payload)
            return _valid(env, bytes(env.payload).decode(), raw)
    except (msgspec.DecodeError, KeyError, ValueError, UnicodeDecodeError):
        pass
    return _check_slowly(raw)


def _check_slowly(raw: bytes) -> ValidEvent | InvalidEvent:
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        return InvalidEvent(event_id=None, message=f"not JSON: {exc}")
    event_id = _event_id_of(obj)
    if not isinstance(obj, dict):
        return InvalidEvent(event_id=None, message="an event must be a JSON object")
    try:
        env = msgspec.convert(obj, _Envelope)
    except msgspec.ValidationError as exc:
        return InvalidEvent(event_id=event_id, message=f"envelope: {exc}")
    spec = EVENT_KINDS.get(env.kind)
    if spec is None:
        return InvalidEvent(event_id=event_id, message=f"unknown event kind {env.kind!r}")
    if env.delivery != spec.delivery:
        return InvalidEvent(
            event_id=event_id,
            message=f"{env.kind} must have delivery {spec.delivery!r}, got {env.delivery!r}",
        )
    try:
        stamp = datetime.fromisoformat(env.occurred_at)
    except ValueError:
        return InvalidEvent(event_id=event_id, message="occurred_at is not an ISO 8601 timestamp")
    if stamp.tzinfo is None:
        return InvalidEvent(event_id=event_id, message="occurred_at needs a time zone (use Z)")
    try:
        # A payload cut to fit carries a `truncated` note (PROTOCOL §4.3), checked on its own.
        rest, _ = split_truncated(env.kind, env.payload)
        msgspec.convert(rest, spec.payload)
    except PayloadError as exc:
        return InvalidEvent(event_id=event_id, message=f"payload of {exc}")
    except msgspec.ValidationError as exc:
        return InvalidEvent(event_id=event_id, message=f"payload of {env.kind}: {exc}")
    return _valid(env, _canonical.encode(env.payload).decode(), raw)


def _valid(env: _EnvelopeFields, payload_json: str, raw: bytes) -> ValidEvent:
    return ValidEvent(
        event_id=env.event_id,
        seq=env.seq,
        epoch=env.epoch,
        kind=env.kind,
        delivery=env.delivery,
        session_id=env.session_id,
        run_id=env.run_id,
        occurred_at=env.occurred_at,
        payload_json=payload_json,
        # The digest is of the exact bytes: the driver resends a lossless event byte for byte from its
        # journal, so the same event_id with other bytes is a conflict, not an honest duplicate.
        digest=hashlib.sha256(raw).hexdigest(),
    )
