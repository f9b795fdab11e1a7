"""In-memory implementations of the adapter ports, for adapter contract tests.

Only our own ports are doubled here; the provider runtime under test is always the real one.
Every emitted payload is validated against the protocol schema, so a contract test also proves the
adapter speaks our event vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from driver.adapters.common.base import HostToolReply, PermissionDecision, PermissionRequest, Ports
from driver.ports.files import AllowedRoots
from driver.protocol.events import validate_payload


class RecordingEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._changed = anyio.Event()

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        validate_payload(kind, payload)
        self.events.append((kind, payload))
        self._changed.set()
        self._changed = anyio.Event()

    def kinds(self) -> list[str]:
        return [k for k, _ in self.events]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [p for k, p in self.events if k == kind]

    async def wait_for(self, kind: str, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until an event of `kind` has been emitted; return the first one."""
        with anyio.fail_after(timeout):
            while True:
                found = self.of(kind)
                if found:
                    return found[0]
                await self._changed.wait()


Decider = Callable[[PermissionRequest], PermissionDecision]


def allow_first(request: PermissionRequest) -> PermissionDecision:
    opt = next(o for o in request.options if o.kind.startswith("allow"))
    return PermissionDecision("allowed", opt.option_id, opt.kind)


def reject_first(request: PermissionRequest) -> PermissionDecision:
    opt = next((o for o in request.options if o.kind.startswith("reject")), None)
    return PermissionDecision("rejected", opt.option_id if opt else None, opt.kind if opt else None)


class ScriptedPermissions:
    """Answers each request with `decide`, or holds it until `release()` when `hold` is set."""

    def __init__(self, decide: Decider = allow_first, *, hold: bool = False) -> None:
        self.decide = decide
        self.hold = hold
        self.requests: list[PermissionRequest] = []
        self.pending = anyio.Event()
        self._release = anyio.Event()
        self._override: PermissionDecision | None = None

    async def request(self, request: PermissionRequest) -> PermissionDecision:
        self.requests.append(request)
        self.pending.set()
        if self.hold:
            await self._release.wait()
            if self._override is not None:
                return self._override
        return self.decide(request)

    def release(self, decision: PermissionDecision | None = None) -> None:
        self._override = decision
        self._release.set()


class EchoHostTools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    async def call(self, name: str, arguments: Any) -> HostToolReply:
        self.calls.append((name, arguments))
        return HostToolReply([{"type": "text", "text": f"{name} ok"}], False)


def recording_ports(
    cwd: Path, permissions: ScriptedPermissions | None = None
) -> tuple[Ports, RecordingEvents, ScriptedPermissions]:
    events = RecordingEvents()
    perms = permissions or ScriptedPermissions()
    return Ports(events, perms, EchoHostTools(), AllowedRoots(cwd)), events, perms
