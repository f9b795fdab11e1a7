"""The types adapters and ports share: what an adapter may ask of the driver (events, permissions, host
tools, file admission) and the values that cross that boundary.

They live below both `driver.adapters` and `driver.ports`, so neither imports the other for them: the
ports implement these protocols, the adapters call them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

PermissionOptionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]


@dataclass(frozen=True, slots=True)
class PermissionOption:
    option_id: str
    kind: PermissionOptionKind
    label: str


@dataclass(frozen=True, slots=True)
class PermissionRequest:
    tool_call_id: str
    title: str
    options: tuple[PermissionOption, ...]
    tool_name: str = ""
    tool_input: Any = None


@dataclass(frozen=True, slots=True)
class PermissionDecision:
    outcome: Literal["allowed", "rejected", "cancelled", "timed_out"]
    option_id: str | None
    option_kind: PermissionOptionKind | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome == "allowed"


@dataclass(frozen=True, slots=True)
class HostToolReply:
    content: list[dict[str, Any]]
    is_error: bool


class EventPort(Protocol):
    async def emit(self, kind: str, payload: dict[str, Any]) -> str | None:
        """Admit one event. Lossless events are journaled before this returns; may wait (backpressure).
        Returns the event_id, or None for an event that was dropped."""


class PermissionPort(Protocol):
    async def request(self, request: PermissionRequest) -> PermissionDecision: ...


class HostToolPort(Protocol):
    async def call(self, name: str, arguments: Any) -> HostToolReply: ...


class FilePort(Protocol):
    def admit(self, path: str | Path) -> Path:
        """Resolve `path` (relative to cwd) and return it if inside an allowed root; else PathNotAllowed."""

    def check_opened(self, fd: int) -> None:
        """PathNotAllowed when the open file is one of the driver's own (reached by a hard link)."""


class PathNotAllowed(PermissionError):
    pass


@dataclass(slots=True)
class Ports:
    events: EventPort
    permissions: PermissionPort
    host_tools: HostToolPort
    files: FilePort

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        await self.events.emit(kind, payload)
