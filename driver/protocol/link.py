"""The link's state machine without I/O (PROTOCOL §2): handshake, liveness, close codes, backoff.

`driver.net.link` feeds it what happened (connected, a frame, a close, the time) and does what it says.
Time is always passed in, so tests run it on a fake clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator

import msgspec

from driver.protocol.backoff import full_jitter
from driver.protocol.frames import CommandFrame, InboundFrame, InvalidCommand, Receipt, Welcome
from driver.protocol.welcome import Clamp, sanitize

WELCOME_TIMEOUT_S = 10.0
STABLE_AFTER_S = 60.0
MAX_PROTOCOL_VIOLATIONS = 5


class LinkPhase(enum.Enum):
    DISCONNECTED = "disconnected"
    HANDSHAKING = "handshaking"  # hello sent, waiting for welcome
    OPEN = "open"
    CLOSED = "closed"  # fatal: the process exits


class CloseReaction(msgspec.Struct, frozen=True):
    reconnect: bool
    exit_status: int | None  # the process exit status when not reconnecting
    stop_providers: bool = True
    reason: str = ""


# PROTOCOL §2.3, as data. Codes not listed are treated as transient (reconnect).
CLOSE_CODES: dict[int, CloseReaction] = {
    4401: CloseReaction(False, 77, reason="bad or revoked token"),
    4403: CloseReaction(False, 77, reason="instance id not allowed for this token"),
    4409: CloseReaction(False, 75, reason="superseded by a newer epoch or connection"),
    4410: CloseReaction(False, 0, reason="instance terminated by the control plane"),
    4400: CloseReaction(True, None, reason="protocol violation by the driver"),
    4408: CloseReaction(True, None, reason="heartbeat timeout"),
    1000: CloseReaction(True, None, reason="normal closure"),
    1001: CloseReaction(True, None, reason="going away"),
    1006: CloseReaction(True, None, reason="abnormal closure"),
    1009: CloseReaction(True, None, reason="message too big (batch size halved)"),
    1011: CloseReaction(True, None, reason="server error"),
    1012: CloseReaction(True, None, reason="service restart"),
    1013: CloseReaction(True, None, reason="try again later"),
}
TRANSIENT = CloseReaction(True, None, reason="connection lost")


class ProtocolViolation(Exception):
    pass


class LinkCore:
    # A plain class, like the others on the way to `hello`: a dataclass costs ~0.5 ms to define.
    def __init__(self, backoff_factory: Callable[[], Iterator[float]] = full_jitter) -> None:
        self.backoff_factory = backoff_factory
        self.phase = LinkPhase.DISCONNECTED
        self.welcome: Welcome | None = None
        self.clamps: list[Clamp] = []  # what the last welcome's values were changed to
        self.opened_at: float | None = None
        self.last_heard = 0.0
        self.handshake_started = 0.0
        self.violations_in_a_row = 0
        self._delays = backoff_factory()

    # -- events in ----------------------------------------------------------------------------------
    def connected(self, now: float) -> None:
        """The socket is open and `hello` was sent."""
        self.phase = LinkPhase.HANDSHAKING
        self.handshake_started = now
        self.last_heard = now
        self.welcome = None

    def frame(self, frame: InboundFrame | InvalidCommand, now: float) -> InboundFrame | InvalidCommand:
        """Account for a received frame; raise ProtocolViolation for one not allowed in this phase."""
        self.last_heard = now
        if self.phase is LinkPhase.HANDSHAKING:
            if not isinstance(frame, Welcome):
                raise ProtocolViolation(f"expected welcome, got {type(frame).__name__.lower()}")
            self.phase = LinkPhase.OPEN
            # Every value inside its range (driver.protocol.welcome): no welcome can make us flap.
            frame, self.clamps = sanitize(frame)
            self.welcome = frame
            self.opened_at = now
            return frame
        if self.phase is not LinkPhase.OPEN:
            raise ProtocolViolation("frame received on a link that is not open")
        if isinstance(frame, Welcome):
            raise ProtocolViolation("a second welcome on one connection")
        assert isinstance(frame, Receipt | CommandFrame | InvalidCommand)
        return frame

    def heard(self, now: float) -> None:
        """Any sign of life that is not a frame (a pong)."""
        self.last_heard = now

    def closed(self, code: int | None, now: float) -> CloseReaction:
        """The connection ended with `code` (None: it never opened). Decide what happens next."""
        was_open_for = (now - self.opened_at) if self.opened_at is not None else 0.0
        self.phase = LinkPhase.DISCONNECTED
        self.opened_at = None
        self.welcome = None
        if was_open_for >= STABLE_AFTER_S:
            # A link that stayed up a minute resets the backoff, and the protocol-violation streak
            # (five 4400s spread over days of healthy links are not "in a row").
            self._delays = self.backoff_factory()
            self.violations_in_a_row = 0
        reaction = CLOSE_CODES.get(code, TRANSIENT) if code is not None else TRANSIENT
        if code == 4400:
            self.violations_in_a_row += 1
            if self.violations_in_a_row >= MAX_PROTOCOL_VIOLATIONS:
                reaction = CloseReaction(False, 76, reason="5 protocol violations in a row")
        else:
            self.violations_in_a_row = 0
        if not reaction.reconnect:
            self.phase = LinkPhase.CLOSED
        return reaction

    # -- questions ----------------------------------------------------------------------------------
    def next_delay(self) -> float:
        return next(self._delays)

    def deadline(self, now: float, heartbeat_s: float) -> str | None:
        """'welcome_timeout' or 'silent' when the link must be dropped at `now`, else None."""
        if self.phase is LinkPhase.HANDSHAKING and now - self.handshake_started >= WELCOME_TIMEOUT_S:
            return "welcome_timeout"
        if self.phase is LinkPhase.OPEN and now - self.last_heard >= 3 * heartbeat_s:
            return "silent"
        return None

    @property
    def heartbeat_s(self) -> float:
        return (self.welcome.heartbeat_interval_ms if self.welcome else 5000) / 1000.0
