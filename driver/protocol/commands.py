"""Commands of PROTOCOL §3, validated per `kind`.

A command frame is decoded twice: once as `CommandFrame` (id, seq, kind: enough to answer it), then,
by kind, as one of the structs below. A failure of the second decode is `command.invalid`, answered
with the message msgspec gives, which names the offending field and never echoes a value.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

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


Command = InputStart | TurnCancel | PermissionResolve | HostToolResult | SessionReset | SessionStop
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
    "PermissionResolve",
    "Repeat",
    "RunInput",
    "SessionReset",
    "SessionStop",
    "TurnCancel",
    "classify_repeat",
    "decode_command",
    "fingerprint",
]
