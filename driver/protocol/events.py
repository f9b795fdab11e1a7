"""Event kinds of PROTOCOL §4.2: payload schema and delivery class of each.

Adapters call `emit(kind, payload)` with a plain dict; the kernel validates it against the kind's
payload struct here (an adapter bug becomes a clear error, never a malformed event on the wire),
then stamps the envelope.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from driver.protocol.payloads import (  # noqa: F401 (re-exported: the payload schemas)
    ArtifactProduced,
    CheckpointFileChunk,
    CheckpointManifestEntry,
    CheckpointRecorded,
    CommandFinished,
    DiagnosticReported,
    DriverStarted,
    ErrorInfo,
    FileChanged,
    FileTouched,
    HostToolCalled,
    HostToolResolved,
    InputSteered,  # PROTOCOL §3.1
    LogRecord,
    LogRecords,
    MessageCompleted,
    MessageDelta,
    MessageStarted,
    ModelUsage,
    PermissionOptionPayload,
    PermissionRequested,
    PermissionResolved,
    PlanEntry,
    PlanUpdated,
    ProcessExited,
    ProcessLeft,
    ProcessOutput,
    ProcessStarted,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    RuntimeResumeUpdated,
    RuntimeSessionReset,
    SessionCommandInfo,
    SessionCommandsUpdated,
    SessionConfigOptionInfo,
    SessionConfigUpdated,
    SessionModeInfo,
    SessionModeUpdated,
    SideEffects,
    ThoughtCompleted,
    ThoughtDelta,
    ThoughtStarted,
    TimingRecorded,
    ToolCallSummary,
    ToolCompleted,
    ToolOutputDelta,
    ToolStarted,
    UsageUpdated,
)

Delivery = Literal["lossless", "best_effort"]


class EventKind(msgspec.Struct, frozen=True):
    payload: type[msgspec.Struct]
    delivery: Delivery
    run_scoped: bool


def _k(payload: type[msgspec.Struct], delivery: Delivery = "lossless", run_scoped: bool = True) -> EventKind:
    return EventKind(payload, delivery, run_scoped)


# The table: kind → (payload schema, delivery class, whether it belongs to a run).
EVENT_KINDS: dict[str, EventKind] = {
    "driver.started": _k(DriverStarted, run_scoped=False),
    "run.started": _k(RunStarted),
    "run.completed": _k(RunCompleted),
    "run.failed": _k(RunFailed),
    "run.cancelled": _k(RunCancelled),
    "message.started": _k(MessageStarted),
    "message.delta": _k(MessageDelta, "best_effort"),
    "message.completed": _k(MessageCompleted),
    "thought.started": _k(ThoughtStarted),
    "thought.delta": _k(ThoughtDelta, "best_effort"),
    "thought.completed": _k(ThoughtCompleted),
    "tool.started": _k(ToolStarted),
    "tool.output.delta": _k(ToolOutputDelta, "best_effort"),
    "tool.completed": _k(ToolCompleted),
    "permission.requested": _k(PermissionRequested),
    "permission.resolved": _k(PermissionResolved),
    "host_tool.called": _k(HostToolCalled),
    "file.changed": _k(FileChanged),
    "artifact.produced": _k(ArtifactProduced),
    "plan.updated": _k(PlanUpdated),
    "usage.updated": _k(UsageUpdated),
    "runtime.resume.updated": _k(RuntimeResumeUpdated, run_scoped=False),
    "runtime.session.reset": _k(RuntimeSessionReset, run_scoped=False),
    "diagnostic.reported": _k(DiagnosticReported, run_scoped=False),
    "session.mode.updated": _k(SessionModeUpdated, run_scoped=False),
    "session.config.updated": _k(SessionConfigUpdated, run_scoped=False),
    "session.commands.updated": _k(SessionCommandsUpdated, run_scoped=False),
    "command.finished": _k(CommandFinished, run_scoped=False),
    "host_tool.resolved": _k(HostToolResolved, run_scoped=False),
    "runtime.timing.recorded": _k(TimingRecorded, run_scoped=False),
    "log.records": _k(LogRecords, "best_effort", run_scoped=False),
    # §8.1: after a run's terminal (so not run-scoped: nothing run-scoped follows a terminal).
    "checkpoint.file": _k(CheckpointFileChunk, run_scoped=False),
    "checkpoint.recorded": _k(CheckpointRecorded, run_scoped=False),

    "input.steered": _k(InputSteered),

    # Not run-scoped in the kernel's sense: the proxy names the run itself (driver.model_proxy.room),
    # so a request that outlived its run is still reported, never dropped.
    "model.usage": _k(ModelUsage, run_scoped=False),

    "process.started": _k(ProcessStarted, run_scoped=False),
    "process.output": _k(ProcessOutput, "best_effort", run_scoped=False),
    "process.exited": _k(ProcessExited, run_scoped=False),
}

RUN_TERMINALS: frozenset[str] = frozenset({"run.completed", "run.failed", "run.cancelled"})


class Event(msgspec.Struct, omit_defaults=False):
    """The envelope on the wire and in the journal."""

    event_id: str
    seq: int
    epoch: int
    kind: str
    delivery: Delivery
    session_id: str
    run_id: str | None
    occurred_at: str
    payload: msgspec.Raw


class PayloadError(ValueError):
    pass


class Truncated(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PROTOCOL §4.3: the note an event cut to fit carries, in any kind's payload."""

    original_bytes: Annotated[int, msgspec.Meta(ge=0)]


TRUNCATED = "truncated"


def split_truncated(kind: str, payload: dict[str, Any]) -> tuple[dict[str, Any], Truncated | None]:
    """The payload without its `truncated` note, and the note checked (PayloadError when malformed)."""
    if TRUNCATED not in payload:
        return payload, None
    rest = {k: v for k, v in payload.items() if k != TRUNCATED}
    try:
        return rest, msgspec.convert(payload[TRUNCATED], Truncated)
    except msgspec.ValidationError as exc:
        raise PayloadError(f"{kind}: truncated: {exc}") from None


def validate_payload(kind: str, payload: dict[str, Any]) -> bytes:
    """Check `payload` against the kind's schema and return its canonical JSON encoding (a
    `truncated` note, when present, is checked and kept as the last field)."""
    spec = EVENT_KINDS.get(kind)
    if spec is None:
        raise PayloadError(f"unknown event kind {kind!r}")
    payload, note = split_truncated(kind, payload)
    try:
        value = msgspec.convert(payload, spec.payload)
    except msgspec.ValidationError as exc:
        raise PayloadError(f"{kind}: {exc}") from None
    body = msgspec.json.encode(value)
    if note is None:
        return body
    tail = b'"truncated":' + msgspec.json.encode(note) + b"}"
    return body[:-1] + (tail if body == b"{}" else b"," + tail)


DEFAULT_MAX_EVENT_BYTES = 256 * 1024  # PROTOCOL §4.3, until a welcome says otherwise
# Room for the envelope (ids, seq, timestamps) around a payload of max_event_bytes within a batch.
ENVELOPE_ALLOWANCE = 1024


def event_limit(welcome: Any) -> int:
    """The payload limit a welcome sets: its max_event_bytes, never more than what fits its batch."""
    return max(1024, min(int(welcome.max_event_bytes), int(welcome.max_batch_bytes) - ENVELOPE_ALLOWANCE))


def fit_payload(kind: str, body: bytes, limit: int) -> bytes:
    """PROTOCOL §4.3: `body` (a validated payload) when it fits `limit` bytes, else its cut, which
    validates again. PayloadError when even the cut cannot fit (identity fields larger than the limit)."""
    if len(body) <= limit:
        return body
    from driver.protocol.oversize import Oversize, cut

    payload = msgspec.json.decode(body)
    budget = limit
    for _ in range(3):
        try:
            out = validate_payload(kind, cut(payload, budget))
        except Oversize as exc:
            raise PayloadError(f"{kind}: {exc}") from None
        if len(out) <= limit:
            return out
        budget -= len(out) - limit  # the schema's encoding differed from the dict's: cut that much more
    raise PayloadError(f"{kind}: payload of {len(body)} bytes could not be cut to {limit} bytes")


def event_id_for(instance_id: str, epoch: int, seq: int) -> str:
    return f"{instance_id}/{epoch}/{seq:06d}"
