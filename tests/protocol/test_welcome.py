"""Every welcome value bounded (driver.protocol.welcome, PROTOCOL §2.2): 0 or negative means the
protocol's default, out-of-range values are clamped, and the link core keeps the bounded welcome."""

from __future__ import annotations

import pytest

from driver.protocol.frames import MAX_FRAME_BYTES, Welcome
from driver.protocol.link import LinkCore
from driver.protocol.welcome import RANGES, sanitize


def test_a_sane_welcome_is_kept_as_it_is() -> None:
    w = Welcome(connection_id="c", heartbeat_interval_ms=500, max_batch_events=10)
    kept, clamps = sanitize(w)
    assert kept is w and clamps == []


@pytest.mark.parametrize("name", sorted(RANGES))
@pytest.mark.parametrize("value", [0, -1, -(2**63)])
def test_zero_or_negative_means_the_default(name: str, value: int) -> None:
    kept, clamps = sanitize(Welcome(connection_id="c", **{name: value}))
    assert getattr(kept, name) == RANGES[name].default
    assert [(c.field, c.given) for c in clamps] == [(name, value)]


def test_out_of_range_values_are_clamped() -> None:
    w = Welcome(
        connection_id="c",
        heartbeat_interval_ms=1,
        max_batch_events=10**9,
        max_batch_bytes=2**62,
        max_event_bytes=10,
    )
    kept, clamps = sanitize(w)
    assert kept.heartbeat_interval_ms == RANGES["heartbeat_interval_ms"].low
    assert kept.max_batch_events == RANGES["max_batch_events"].high
    assert kept.max_batch_bytes == MAX_FRAME_BYTES
    assert kept.max_event_bytes == RANGES["max_event_bytes"].low
    assert {c.field for c in clamps} == set(RANGES)


def test_an_event_never_larger_than_its_batch() -> None:
    kept, clamps = sanitize(Welcome(connection_id="c", max_batch_bytes=100_000, max_event_bytes=200_000))
    assert kept.max_event_bytes == 100_000
    assert [c.why for c in clamps] == ["above max_batch_bytes"]


def test_the_link_core_keeps_the_bounded_welcome() -> None:
    core = LinkCore()
    core.connected(0.0)
    frame = core.frame(Welcome(connection_id="c", heartbeat_interval_ms=0), 0.0)
    assert isinstance(frame, Welcome) and frame.heartbeat_interval_ms == 5_000
    assert core.heartbeat_s == 5.0
    assert core.deadline(1.0, core.heartbeat_s) is None  # 0 ms would have been "silent" at once
    assert [c.field for c in core.clamps] == ["heartbeat_interval_ms"]
