"""Link frames of PROTOCOL §2-§4 as msgspec structs.

Inbound frames (CP to driver) are decoded tolerantly: unknown fields are ignored. The frame `type`
picks the struct; an unknown `type` is a protocol error the caller answers, never a crash.
Outbound frames are encoded from these structs, except event batches, which are spliced from the
journal's stored bytes (see `encode_events_frame`) so an event is encoded exactly once in its life.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

PROTOCOL_VERSION = 1
SUBPROTOCOL = "agent-driver.v1"
MAX_FRAME_BYTES = 4 * 1024 * 1024
# Every integer read from the CP fits SQLite's INTEGER and a C long: a bigger one is refused when the
# frame is decoded, not later by the journal or a timer.
I64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]

DriverStateName = Literal["starting", "ready", "running", "waiting_permission", "stopping"]
CommandStatus = Literal["accepted", "completed", "failed", "cancelled"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


class Capability(msgspec.Struct, frozen=True, omit_defaults=True):
    id: str
    supported: bool
    mode: str | None = None  # `steer` only: "native" or "follow_up" (PROTOCOL §3.1)


class OutboxSummary(msgspec.Struct):
    lossless_pending: int
    oldest_pending_seq: int | None = None


class Hello(msgspec.Struct, tag="hello", tag_field="type", kw_only=True):
    protocol: int
    driver_instance_id: str
    epoch: int
    driver_version: str
    pid: int
    runtime: str
    revision: str
    session_kind: str
    capabilities: list[Capability]
    last_command_seq: int
    outbox: OutboxSummary
    started_at: str


class Welcome(msgspec.Struct, tag="welcome", tag_field="type", kw_only=True):
    """Its numbers are any JSON integer, however large: `driver.protocol.welcome.sanitize` clamps each
    to its stated range before anything uses it (PROTOCOL §9 "Every number the CP gives is clamped")."""

    connection_id: str
    heartbeat_interval_ms: int = 5000
    max_batch_events: int = 256
    max_batch_bytes: int = 1_048_576
    max_event_bytes: int = 262_144
    accepted_capabilities: list[str] = msgspec.field(default_factory=list)


class HeartbeatOutbox(msgspec.Struct, kw_only=True):
    lossless_pending: int
    best_effort_dropped: int
    in_flight: int = 0
    oldest_pending_age_ms: int | None = None
    retries: int = 0


class HeartbeatActivity(msgspec.Struct, kw_only=True):
    """What the provider's whole process tree is doing (PROTOCOL §2.5); fields that do not apply are null."""

    provider_pid: int | None = None
    provider_cpu_ms: int | None = None
    provider_rss_mb: float | None = None
    provider_processes: int | None = None
    last_provider_output_ms_ago: int | None = None
    tool_call_id: str | None = None
    tool_running_ms: int | None = None


class HeartbeatProcess(msgspec.Struct, kw_only=True):
    """A running process of PROTOCOL §6.8."""

    process_id: str
    pid: int
    running_ms: int


class Heartbeat(msgspec.Struct, tag="heartbeat", tag_field="type", kw_only=True):
    at: str
    state: DriverStateName
    run_id: str | None
    outbox: HeartbeatOutbox
    activity: HeartbeatActivity | None = None
    queued: list[str] = msgspec.field(default_factory=list)  # queued run ids, in start order (§3.1)

    processes: list[HeartbeatProcess] = msgspec.field(default_factory=list)  # §6.8


class CommandError(msgspec.Struct, frozen=True):
    code: str
    message: str
    retryable: bool = False


class CommandUpdate(msgspec.Struct, tag="command.update", tag_field="type", kw_only=True, omit_defaults=True):
    command_id: str
    status: CommandStatus
    result: dict[str, Any] | None = None
    error: CommandError | None = None


class Rejection(msgspec.Struct, frozen=True):
    event_id: str
    code: str = "event.rejected"
    message: str = ""
    retryable: bool = False


class Receipt(msgspec.Struct, tag="receipt", tag_field="type", kw_only=True):
    batch: I64
    accepted: list[str] = msgspec.field(default_factory=list)
    rejected: list[Rejection] = msgspec.field(default_factory=list)


class CommandFrame(msgspec.Struct, tag="command", tag_field="type", kw_only=True):
    """A command as it arrives; `body` validation per kind happens in `commands.py`."""

    command_id: str
    seq: I64
    kind: str


class InvalidCommand(msgspec.Struct, frozen=True):
    """A `command` frame that does not decode as `CommandFrame` (a `seq` outside int64, a missing or
    mistyped `kind`) but whose `command_id` is readable: still answered, `failed` / `command.invalid`
    (PROTOCOL §3, §9). Never on the wire: `decode_inbound` builds it."""

    command_id: str
    problem: str  # msgspec's message: it names the field, never echoes a value


class _CommandId(msgspec.Struct, tag="command", tag_field="type"):
    """Just enough of a broken command frame to answer it."""

    command_id: Annotated[str, msgspec.Meta(min_length=1)]


class EventsFrame(msgspec.Struct, tag="events", tag_field="type", kw_only=True):
    """Only used by the control plane side and by tests: the driver splices raw event bytes."""

    batch: int
    events: list[msgspec.Raw]


# CP → driver.
InboundFrame = Welcome | Receipt | CommandFrame
# Driver → CP (what the reference control plane decodes).
DriverFrame = Hello | Heartbeat | CommandUpdate | EventsFrame

_inbound = msgspec.json.Decoder(InboundFrame)
_command_id = msgspec.json.Decoder(_CommandId)
_driver_frames = msgspec.json.Decoder(DriverFrame)
_encoder = msgspec.json.Encoder()


class FrameError(ValueError):
    """A frame that is not valid JSON, not an object, of an unknown type, or missing a field."""


NESTED_TOO_DEEPLY = "JSON nested too deeply"


def decode_inbound(data: bytes | str) -> InboundFrame | InvalidCommand:
    """The frame, or `InvalidCommand` for a command frame that is invalid but has a readable id."""
    try:
        frame: InboundFrame = _inbound.decode(data)
        return frame
    except msgspec.ValidationError as exc:
        # Valid JSON of the wrong shape: a command whose id can be read is answered, not dropped.
        try:
            head = _command_id.decode(data)
        except (msgspec.DecodeError, RecursionError):
            raise FrameError(str(exc)) from None
        return InvalidCommand(head.command_id, str(exc))
    except msgspec.DecodeError as exc:
        raise FrameError(str(exc)) from None
    except RecursionError:
        # msgspec recurses per nesting level; Python's recursion limit is the bound (~1000 levels).
        raise FrameError(NESTED_TOO_DEEPLY) from None


def decode_driver_frame(data: bytes | str) -> DriverFrame:
    try:
        frame: DriverFrame = _driver_frames.decode(data)
        return frame
    except msgspec.DecodeError as exc:
        raise FrameError(str(exc)) from None


def encode(frame: msgspec.Struct) -> bytes:
    return _encoder.encode(frame)


def encode_events_frame(batch: int, raw_events: list[bytes]) -> bytes:
    """Build an `events` frame from already-encoded event objects without re-encoding them."""
    return b'{"type":"events","batch":%d,"events":[%s]}' % (batch, b",".join(raw_events))
