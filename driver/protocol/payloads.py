"""The payload schema of every event kind of PROTOCOL §4.2 (and the project's own, docs/protocol.md).

Field names are normative; `driver.protocol.events` ties each kind to its schema and delivery class.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec


class _P(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class DriverStarted(_P):
    epoch: int
    revision: str
    runtime: str
    capabilities: list[dict[str, Any]]
    timings: dict[str, float | None]


class RunStarted(_P):
    run_id: str
    revision: str
    input_summary: str


class RunCompleted(_P):
    stop_reason: str
    final_message_id: str | None
    final_message_text: str
    usage: dict[str, Any] | None
    dropped_best_effort: int = 0


class ErrorInfo(msgspec.Struct, kw_only=True):
    code: str
    message: str
    retryable: bool = False
    details: dict[str, Any] | None = None


class RunFailed(_P):
    error: ErrorInfo
    dropped_best_effort: int = 0


class ToolCallSummary(msgspec.Struct, kw_only=True):
    tool_call_id: str
    name: str
    status: str  # the last status reported: "running" when it had not completed


class ProcessLeft(msgspec.Struct, kw_only=True):
    pid: int
    argv0: str


# PROTOCOL §9: the raw bytes (base64) of a name that is not UTF-8 (`path` then carries `\xNN`
# escapes, driver.protocol.paths); absent, and not encoded, for a name that is UTF-8.
PathB64 = str | msgspec.UnsetType


class FileTouched(msgspec.Struct, kw_only=True):
    path: str
    change: Literal["created", "modified", "deleted"]
    path_b64: PathB64 = msgspec.UNSET


class SideEffects(msgspec.Struct, kw_only=True):
    files_changed: list[FileTouched] = msgspec.field(default_factory=list)
    processes_left: list[ProcessLeft] = msgspec.field(default_factory=list)
    truncated: bool = False  # the cwd scan hit its bound: files_changed may be incomplete


class RunCancelled(_P):
    reason: str
    requested_by: str
    dropped_best_effort: int = 0
    tool_calls: list[ToolCallSummary] = msgspec.field(default_factory=list)
    side_effects: SideEffects = msgspec.field(default_factory=SideEffects)
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class MessageStarted(_P):
    message_id: str
    role: str


class MessageDelta(_P):
    message_id: str
    text: str


class MessageCompleted(_P):
    message_id: str
    role: str
    text: str


class ThoughtStarted(_P):
    thought_id: str
    text: str = ""


class ThoughtDelta(_P):
    thought_id: str
    text: str


class ThoughtCompleted(_P):
    thought_id: str
    text: str


class ToolStarted(_P):
    tool_call_id: str
    name: str
    title: str
    input: Any
    parent_tool_call_id: str | None = None  # the delegating call, for a subagent's work


class ToolOutputDelta(_P):
    tool_call_id: str
    text: str


class ToolCompleted(_P):
    tool_call_id: str
    status: Literal["completed", "failed", "declined", "cancelled"]
    output: Any
    exit_code: int | None = None


class PermissionOptionPayload(msgspec.Struct, kw_only=True):
    option_id: str
    kind: str
    label: str


class PermissionRequested(_P):
    request_id: str
    tool_call_id: str
    title: str
    options: list[PermissionOptionPayload]
    expires_at: str


class PermissionResolved(_P):
    request_id: str
    outcome: Literal["allowed", "rejected", "cancelled", "timed_out"]
    option_id: str | None
    decided_by: Literal["control_plane", "policy", "timeout", "cancel"]


class HostToolCalled(_P):
    call_id: str
    run_id: str | None
    name: str
    arguments: Any


class FileChanged(_P):
    path: str
    change: Literal["created", "modified", "deleted"]
    sha256: str | None
    path_b64: PathB64 = msgspec.UNSET


class ArtifactProduced(_P):
    path: str
    size: int
    sha256: str
    path_b64: PathB64 = msgspec.UNSET


class PlanEntry(msgspec.Struct, kw_only=True):
    content: str
    status: str


class PlanUpdated(_P):
    entries: list[PlanEntry]


class ModelUsage(_P):
    """PROTOCOL §6.7: one model request, measured by the model proxy from the upstream's usage report."""

    run_id: str | None
    upstream: str
    model: str
    input_tokens: int
    output_tokens: int
    cached_input_tokens: int
    cost_usd: float | None
    request_id: str | None
    # The figures or the cost are the proxy's conservative charge (no usage reported, a cut answer, an
    # unpriced model at the table's highest rates), not the upstream's own report.
    estimated: bool = False


class UsageUpdated(_P):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cost_usd: float | None = None


class RuntimeResumeUpdated(_P):
    runtime: str
    value: str


class RuntimeSessionReset(_P, omit_defaults=True):
    previous: str | None
    current: str | None
    # §8.1: why a native checkpoint could not be restored (omitted for the other resets).
    reason: str | None = None


class SessionModeInfo(msgspec.Struct, kw_only=True):
    id: str
    name: str = ""
    description: str = ""


class SessionModeUpdated(_P):
    """The provider session's current mode and the modes it offers (ACP session modes)."""

    current_mode_id: str
    available_modes: list[SessionModeInfo]


class SessionConfigOptionInfo(msgspec.Struct, kw_only=True):
    id: str
    name: str
    category: str | None = None
    type: str  # "select" | "boolean" (ACP v1), or a newer kind reported as the agent names it
    current_value: Any = None
    choices: list[Any] | None = None  # the values of a select option


class SessionConfigUpdated(_P):
    """Every configuration option of the provider session, with its current value."""

    options: list[SessionConfigOptionInfo]


class SessionCommandInfo(msgspec.Struct, kw_only=True):
    name: str
    description: str = ""
    input_hint: str | None = None


class SessionCommandsUpdated(_P):
    """The commands (slash commands) the provider session offers now."""

    commands: list[SessionCommandInfo]


class DiagnosticReported(_P):
    code: str
    severity: Literal["debug", "info", "warning", "error"]
    message: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)


class CommandFinished(_P):
    command_id: str
    command_kind: str
    status: Literal["completed", "failed", "cancelled"]
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None


class HostToolResolved(_P):
    call_id: str
    outcome: Literal["completed", "failed", "timed_out", "cancelled"]


class TimingRecorded(_P):
    phase: Literal["hello", "provider.spawn", "provider.ready", "session.open", "session.resume", "first_token"]
    ms: float
    mode: Literal["cold", "warm", "resume"]
    run_id: str | None = None


class LogRecord(msgspec.Struct, kw_only=True):
    at: str
    level: str
    logger: str
    message: str
    fields: dict[str, Any] = msgspec.field(default_factory=dict)


class LogRecords(_P):
    records: list[LogRecord]
    dropped: int = 0  # lines not sent since the previous batch (held-buffer overflow, rate limit)


class CheckpointFileChunk(_P):
    """§8.1 `checkpoint.file`: bytes `offset`.. of one file of a checkpoint (base64)."""

    checkpoint_id: str
    path: str  # relative to the provider's home
    offset: Annotated[int, msgspec.Meta(ge=0)]
    data_b64: str
    size: Annotated[int, msgspec.Meta(ge=0)]  # the whole file's size
    sha256: str  # of the whole file


class CheckpointManifestEntry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    path: str
    size: Annotated[int, msgspec.Meta(ge=0)]
    sha256: str


class CheckpointRecorded(_P):
    """§8.1 `checkpoint.recorded`: the manifest; the checkpoint is complete once this is receipted."""

    checkpoint_id: str
    run_id: str | None
    runtime: str
    native_ref: str
    format: Literal[1]
    files: list[CheckpointManifestEntry]

class InputSteered(_P):
    """PROTOCOL §3.1: a steer reached the provider (`native`: into the running turn; `follow_up`: as
    one more turn of the same run)."""

    run_id: str
    command_id: str
    text: str
    mode: Literal["native", "follow_up"]

# -- processes and terminals outside a run (PROTOCOL §6.8) --------------------------------------------


class PtySize(msgspec.Struct, kw_only=True):
    cols: int
    rows: int


class ProcessStarted(_P):
    process_id: str
    argv: list[str]
    pty: PtySize | None
    pid: int


class ProcessOutput(_P):
    process_id: str
    offset: int  # of the first byte, counted in the process's raw output bytes
    data: str  # UTF-8 text; invalid bytes as U+FFFD
    truncated_before: bool = False


class ProcessExited(_P):
    process_id: str
    exit_code: int | None
    signal: str | None  # the signal's name without SIG ("KILL"), when a signal ended it
    output_bytes: int
    tail: str  # the last 4 KiB of output, decoded as `data` is
