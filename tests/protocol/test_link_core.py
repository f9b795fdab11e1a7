"""The link's sans-I/O core (PROTOCOL §2.2-§2.5) on a fake clock: close codes, handshake, liveness."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from driver.protocol.backoff import full_jitter
from driver.protocol.frames import CommandFrame, Receipt, Welcome
from driver.protocol.link import (
    MAX_PROTOCOL_VIOLATIONS,
    STABLE_AFTER_S,
    WELCOME_TIMEOUT_S,
    LinkCore,
    LinkPhase,
    ProtocolViolation,
)

WELCOME = Welcome(connection_id="con-1", heartbeat_interval_ms=5000)
RECEIPT = Receipt(batch=1, accepted=["e1"])
COMMAND = CommandFrame(command_id="cmd-1", seq=1, kind="input.start")


def counting() -> Iterator[float]:
    """Delays 0, 1, 2, ... so a reset of the backoff is visible as a return to 0."""
    return (float(n) for n in itertools.count())


def opened(core: LinkCore, now: float = 0.0) -> LinkCore:
    core.connected(now)
    core.frame(WELCOME, now)
    return core


# -- close codes ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("code", "reconnect", "status"),
    [
        (4401, False, 77),
        (4403, False, 77),
        (4409, False, 75),
        (4410, False, 0),
        (4400, True, None),
        (4408, True, None),
        (1001, True, None),
        (1006, True, None),
        (1011, True, None),
        (1012, True, None),
        (1013, True, None),
        (None, True, None),  # the dial failed: no close code at all
        (4999, True, None),  # a code the table does not know is transient
    ],
)
def test_close_code_table(code: int | None, reconnect: bool, status: int | None) -> None:
    core = opened(LinkCore())
    reaction = core.closed(code, 1.0)
    assert (reaction.reconnect, reaction.exit_status) == (reconnect, status)
    assert core.phase is (LinkPhase.DISCONNECTED if reconnect else LinkPhase.CLOSED)
    assert core.welcome is None


def test_five_protocol_violations_in_a_row_are_fatal() -> None:
    core = LinkCore()
    for _ in range(MAX_PROTOCOL_VIOLATIONS - 1):
        opened(core)
        assert core.closed(4400, 1.0).reconnect
    assert MAX_PROTOCOL_VIOLATIONS == 5
    opened(core)
    fatal = core.closed(4400, 1.0)
    assert not fatal.reconnect and fatal.exit_status == 76
    assert core.phase is LinkPhase.CLOSED


def test_another_close_breaks_the_run_of_violations() -> None:
    core = LinkCore()
    for _ in range(4):
        assert core.closed(4400, 1.0).reconnect
    assert core.closed(1006, 1.0).reconnect
    for _ in range(4):
        assert core.closed(4400, 1.0).reconnect
    assert not core.closed(4400, 1.0).reconnect


def test_a_link_that_stayed_up_a_minute_resets_the_run_of_violations() -> None:
    core = LinkCore()
    for _ in range(4):
        assert core.closed(4400, 1.0).reconnect
    core.connected(100.0)
    core.frame(Welcome(connection_id="c"), 100.0)
    assert core.closed(4400, 100.0 + 61.0).reconnect  # a streak of 1, not 5
    for _ in range(3):
        assert core.closed(4400, 200.0).reconnect
    assert not core.closed(4400, 200.0).reconnect


# -- handshake ----------------------------------------------------------------------------------------
def test_welcome_opens_the_link_and_sets_the_heartbeat() -> None:
    core = LinkCore()
    core.connected(10.0)
    assert core.phase is LinkPhase.HANDSHAKING
    assert core.frame(Welcome(connection_id="c", heartbeat_interval_ms=2000), 11.0) is not None
    assert (core.phase, core.heartbeat_s) == (LinkPhase.OPEN, 2.0)
    assert core.frame(RECEIPT, 12.0) is RECEIPT
    assert core.frame(COMMAND, 12.0) is COMMAND


@pytest.mark.parametrize("frame", [RECEIPT, COMMAND])
def test_frames_before_welcome_are_a_violation(frame: Receipt | CommandFrame) -> None:
    core = LinkCore()
    core.connected(0.0)
    with pytest.raises(ProtocolViolation, match="expected welcome"):
        core.frame(frame, 1.0)


def test_a_second_welcome_is_a_violation() -> None:
    core = opened(LinkCore())
    with pytest.raises(ProtocolViolation, match="second welcome"):
        core.frame(WELCOME, 1.0)


def test_a_frame_on_a_link_that_is_not_open_is_a_violation() -> None:
    core = LinkCore()
    with pytest.raises(ProtocolViolation):
        core.frame(RECEIPT, 0.0)


def test_welcome_timeout_at_ten_seconds() -> None:
    assert WELCOME_TIMEOUT_S == 10.0
    core = LinkCore()
    core.connected(100.0)
    assert core.deadline(109.99, 5.0) is None
    assert core.deadline(110.0, 5.0) == "welcome_timeout"
    core.frame(WELCOME, 105.0)
    assert core.deadline(110.0, 5.0) is None


def test_a_reconnect_starts_a_fresh_welcome_timer() -> None:
    core = opened(LinkCore(), 0.0)
    core.closed(1006, 50.0)
    core.connected(60.0)
    assert core.deadline(69.0, 5.0) is None
    assert core.deadline(70.0, 5.0) == "welcome_timeout"


# -- liveness -----------------------------------------------------------------------------------------
def test_silent_after_three_heartbeat_intervals() -> None:
    core = opened(LinkCore(), 0.0)
    hb = core.heartbeat_s
    assert hb == 5.0
    assert core.deadline(3 * hb - 0.01, hb) is None
    assert core.deadline(3 * hb, hb) == "silent"


def test_any_frame_or_pong_keeps_the_link_alive() -> None:
    core = opened(LinkCore(), 0.0)
    core.frame(RECEIPT, 10.0)
    assert core.deadline(24.9, 5.0) is None
    assert core.deadline(25.0, 5.0) == "silent"
    core.heard(24.0)
    assert core.deadline(38.9, 5.0) is None
    assert core.deadline(39.0, 5.0) == "silent"


def test_no_liveness_verdict_while_disconnected() -> None:
    core = opened(LinkCore(), 0.0)
    core.closed(1006, 1.0)
    assert core.deadline(1000.0, 5.0) is None


# -- backoff ------------------------------------------------------------------------------------------
def test_reconnect_delays_follow_the_backoff() -> None:
    core = LinkCore(backoff_factory=counting)
    assert [core.next_delay() for _ in range(3)] == [0.0, 1.0, 2.0]


def test_backoff_resets_after_a_link_stayed_up_sixty_seconds() -> None:
    core = LinkCore(backoff_factory=counting)
    core.next_delay()
    core.next_delay()
    opened(core, 100.0)
    core.closed(1006, 100.0 + STABLE_AFTER_S - 0.01)
    assert core.next_delay() == 2.0, "a short-lived link keeps growing the backoff"
    opened(core, 200.0)
    core.closed(1006, 200.0 + STABLE_AFTER_S)
    assert STABLE_AFTER_S == 60.0
    assert core.next_delay() == 0.0


def test_a_handshake_that_never_opened_does_not_reset_the_backoff() -> None:
    core = LinkCore(backoff_factory=counting)
    core.next_delay()
    core.connected(0.0)
    core.closed(1006, 500.0)
    assert core.next_delay() == 1.0


def test_default_backoff_with_a_seeded_rng() -> None:
    core = LinkCore(backoff_factory=lambda: full_jitter(rng=random.Random(5)))
    delays = [core.next_delay() for _ in range(10)]
    assert 0.0 <= delays[0] <= 1.0
    assert all(0.0 <= d <= 30.0 for d in delays)
    opened(core, 0.0)
    core.closed(1001, 61.0)
    assert core.next_delay() == delays[0], "after a reset the sequence starts over"
