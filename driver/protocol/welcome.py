"""Sane bounds for every value a `welcome` sets (PROTOCOL §2.2, §2.5, §4.3).

The control plane is trusted with the link, not with the driver's liveness: a `heartbeat_interval_ms`
of 0 would make the driver declare its link silent at once and redial forever (a flapping link), a
batch limit of 0 would stop every event, a negative byte limit would wedge the sender. Each value is
taken when it is inside its range; a value of 0 or less means the CP gave none that can be used, so the
protocol's default applies; a positive value outside the range is clamped to the nearest bound. Every
change is described by a `Clamp`, which the link logs once per process for each field and value.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from driver.protocol.frames import MAX_FRAME_BYTES, Welcome


class Range(NamedTuple):
    default: int  # the protocol's value, for a value of 0 or less
    low: int
    high: int


# field → (default, lowest, highest). The heartbeat bounds keep liveness meaningful (at least 4
# pings a second at most, a loss noticed within 15 minutes at worst); the batch bytes never pass the
# 4 MiB frame limit; an event always leaves room for its identity fields (4 KiB).
RANGES: dict[str, Range] = {
    "heartbeat_interval_ms": Range(5_000, 250, 300_000),
    "max_batch_events": Range(256, 1, 10_000),
    "max_batch_bytes": Range(1_048_576, 64 * 1024, MAX_FRAME_BYTES),
    "max_event_bytes": Range(262_144, 4 * 1024, MAX_FRAME_BYTES),
}


class Clamp(NamedTuple):
    field: str
    given: int
    used: int
    why: str  # "not positive: the default", "below the floor", "above the ceiling"


def bounded(name: str, value: int) -> tuple[int, str | None]:
    r = RANGES[name]
    if value <= 0:
        return r.default, "not positive: the protocol's default is used"
    if value < r.low:
        return r.low, "below the floor"
    if value > r.high:
        return r.high, "above the ceiling"
    return value, None


def sanitize(welcome: Welcome) -> tuple[Welcome, list[Clamp]]:
    """The welcome with every value inside its range, and what was changed."""
    changes: dict[str, int] = {}
    clamps: list[Clamp] = []
    for name in RANGES:
        given = int(getattr(welcome, name))
        used, why = bounded(name, given)
        if why is not None:
            changes[name] = used
            clamps.append(Clamp(name, given, used, why))
    # An event is never larger than its batch (§4.3).
    event = changes.get("max_event_bytes", welcome.max_event_bytes)
    batch = changes.get("max_batch_bytes", welcome.max_batch_bytes)
    if event > batch:
        changes["max_event_bytes"] = batch
        clamps.append(Clamp("max_event_bytes", int(welcome.max_event_bytes), batch, "above max_batch_bytes"))
    if not changes:
        return welcome, []
    return msgspec.structs.replace(welcome, **changes), clamps
