"""Commands of PROTOCOL §3, validated per `kind`.

A command frame is decoded twice: once as `CommandFrame` (id, seq, kind: enough to answer it), then,
by kind, as one of the structs below. A failure of the second decode is `command.invalid`, answered
with the message msgspec gives, which names the offending field and never echoes a value.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import msgspec

from driver.protocol.frames import NESTED_TOO_DEEPLY, CommandFrame

NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]


class Attachment(msgspec.Struct, frozen=True):
    name: NonEmpty
    url: NonEmpty
    sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
    size: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]


class RunInput(msgspec.Struct, frozen=True):
    text: str
    attachments: list[Attachment] = msgspec.field(default_factory=list)


class _Command(msgspec.Struct, kw_only=True, tag_field="kind"):
    command_id: NonEmpty
    seq: Annotated[int, msgspec.Meta(ge=1, le=2**63 - 1)]


class InputStart(_Command, tag="input.start"):
    run_id: NonEmpty
    input: RunInput
    traceparent: str | None = None  # W3C trace context: the run span's parent (PROTOCOL §3, §6.6)
    queue: bool = False  # PROTOCOL §3.1: while a run is active, hold it and start it after


class InputSteer(_Command, tag="input.steer"):
    """PROTOCOL §3.1: more user input for the active run."""

    run_id: NonEmpty
    input: RunInput


class TurnCancel(_Command, tag="turn.cancel"):
    run_id: NonEmpty
    reason: str = ""


class PermissionResolve(_Command, tag="permission.resolve"):
    request_id: NonEmpty
    option_id: NonEmpty


class HostToolResult(_Command, tag="host_tool.result"):
    call_id: NonEmpty
    content: list[dict[str, Any]] = msgspec.field(default_factory=list)
    is_error: bool = False


class SessionReset(_Command, tag="session.reset"):
    reason: str = ""


class SessionStop(_Command, tag="session.stop"):
    reason: str = ""


# -- processes and terminals outside a run (PROTOCOL §6.8) ---------------------------------------------
# A process id names files under state_dir (hashed) and appears in the console: printable, bounded.
ProcessId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@-]+$")]
# struct winsize holds unsigned shorts; a terminal larger than this is a mistake, not a screen.
TermCells = Annotated[int, msgspec.Meta(ge=1, le=4096)]
MAX_PROCESS_INPUT = 1024 * 1024  # characters of one process.input
MAX_ARGV = 256
MAX_ENV = 256


class PtyRequest(msgspec.Struct, frozen=True):
    cols: TermCells = 80
    rows: TermCells = 24


class ProcessStart(_Command, tag="process.start"):
    process_id: ProcessId
    argv: Annotated[list[str], msgspec.Meta(max_length=MAX_ARGV)] = msgspec.field(default_factory=list)
    cwd: str | None = None
    env: Annotated[dict[str, str], msgspec.Meta(max_length=MAX_ENV)] = msgspec.field(default_factory=dict)
    pty: PtyRequest | None = None


class ProcessInput(_Command, tag="process.input"):
    process_id: ProcessId
    data: Annotated[str, msgspec.Meta(max_length=MAX_PROCESS_INPUT)]


class ProcessResize(_Command, tag="process.resize"):
    process_id: ProcessId
    cols: TermCells
    rows: TermCells


class ProcessSignal(_Command, tag="process.signal"):
    process_id: ProcessId
    signal: Literal["TERM", "KILL", "INT", "HUP"]


class ProcessReplay(_Command, tag="process.replay"):
    process_id: ProcessId
    from_offset: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] = 0


ProcessCommand = ProcessStart | ProcessInput | ProcessResize | ProcessSignal | ProcessReplay

Command = (
    InputStart
    | InputSteer
    | TurnCancel
    | PermissionResolve
    | HostToolResult
    | SessionReset
    | SessionStop
    | ProcessStart
    | ProcessInput
    | ProcessResize
    | ProcessSignal
    | ProcessReplay
)
COMMAND_KINDS: tuple[str, ...] = tuple(c.__struct_config__.tag for c in Command.__args__)  # type: ignore[attr-defined]

_decoder = msgspec.json.Decoder(Command)


class CommandInvalid(ValueError):
    pass


def decode_command(raw: bytes | str) -> Command:
    """Decode a whole command frame (the `type` field is ignored here) into its kind's struct."""
    try:
        command: Command = _decoder.decode(raw)
        return command
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if "`$.kind`" in msg and "Invalid value" in msg:
            raise CommandInvalid(f"unknown command kind (known: {', '.join(COMMAND_KINDS)})") from None
        raise CommandInvalid(msg) from None
    except msgspec.DecodeError as exc:
        raise CommandInvalid(str(exc)) from None
    except RecursionError:
        raise CommandInvalid(NESTED_TOO_DEEPLY) from None


class Repeat(enum.Enum):
    """What a command frame is, given what was seen before under its command_id (PROTOCOL §3)."""

    NEW = "new"  # execute it
    CONFLICT = "conflict"  # same id, other content: answer failed / command.conflict
    RESEND_TERMINAL = "resend_terminal"  # already finished: resend the stored terminal status
    STILL_RUNNING = "still_running"  # accepted, not finished: resend `accepted`


def classify_repeat(fingerprint: str, known_fingerprint: str | None, terminal_frame: bytes | None) -> Repeat:
    """`known_fingerprint` is None for a command_id never seen; `terminal_frame` is its stored
    terminal `command.update`, if it has one."""
    if known_fingerprint is None:
        return Repeat.NEW
    if known_fingerprint != fingerprint:
        return Repeat.CONFLICT
    return Repeat.RESEND_TERMINAL if terminal_frame is not None else Repeat.STILL_RUNNING


def fingerprint(raw: bytes | str) -> str:
    """A content hash of a command, for the `command.conflict` check: only `command_id`, `kind` and
    the fields §3 names for the kind count (driver.protocol.fingerprint), keys sorted, so neither an
    unknown extra field nor re-serialisation by the CP (key order, whitespace) is a conflict."""
    from driver.protocol.fingerprint import fingerprint as content_fingerprint

    return content_fingerprint(raw)


__all__ = [
    "COMMAND_KINDS",
    "Attachment",
    "Command",
    "CommandFrame",
    "CommandInvalid",
    "HostToolResult",
    "InputStart",
    "InputSteer",
    "PermissionResolve",
    "ProcessCommand",
    "ProcessInput",
    "ProcessReplay",
    "ProcessResize",
    "ProcessSignal",
    "ProcessStart",
    "PtyRequest",
    "Repeat",
    "RunInput",
    "SessionReset",
    "SessionStop",
    "TurnCancel",
    "classify_repeat",
    "decode_command",
    "fingerprint",
]
