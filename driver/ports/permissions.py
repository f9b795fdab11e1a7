"""The permissions port (PROTOCOL §6.2).

`supervised`: each provider approval request becomes `permission.requested`; the control plane's
`permission.resolve` answers it; with no answer by `expires_at` it is rejected (`timed_out`).
`full_access`: providers are configured not to ask; one that asks anyway is allowed by policy, and
that is recorded too, so the history never hides a decision.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import anyio

from driver.interfaces import PermissionDecision, PermissionOption, PermissionRequest

Emit = Callable[[str, dict[str, Any]], Awaitable[object]]
DecidedBy = Literal["control_plane", "policy", "timeout", "cancel"]


class PermissionCommandError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Pending:
    request: PermissionRequest
    done: anyio.Event = field(default_factory=anyio.Event)
    decision: PermissionDecision | None = None
    decided_by: DecidedBy = "control_plane"


class PermissionBroker:
    def __init__(
        self,
        emit: Emit,
        *,
        policy: Literal["full_access", "supervised"],
        timeout_ms: int,
        id_prefix: str,
        on_pending_change: Callable[[int], None] = lambda n: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self.policy = policy
        self.timeout_s = timeout_ms / 1000.0
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self._pending: dict[str, _Pending] = {}
        self._on_change = on_pending_change
        self.rejected_tool_calls: set[str] = set()

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    async def request(self, request: PermissionRequest) -> PermissionDecision:
        request_id = f"{self._prefix}-{next(self._ids)}"
        # The deadline is fixed together with `expires_at`, before `emit` (which may wait on the
        # outbox's backpressure): the timeout fires at `expires_at`, however long the emit took.
        deadline = anyio.current_time() + self.timeout_s
        expires = datetime.now(UTC) + timedelta(seconds=self.timeout_s)
        pending = _Pending(request)
        supervised = self.policy != "full_access"
        if supervised:
            # Pending from the start: the event may reach the CP, and its answer come back, while
            # `emit` still waits.
            self._pending[request_id] = pending
            self._on_change(len(self._pending))
        try:
            await self._emit(
                "permission.requested",
                {
                    "request_id": request_id,
                    "tool_call_id": request.tool_call_id,
                    "title": request.title,
                    "options": [{"option_id": o.option_id, "kind": o.kind, "label": o.label} for o in request.options],
                    "expires_at": expires.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                },
            )
            if supervised:
                try:
                    with anyio.move_on_at(deadline):
                        await pending.done.wait()
                except anyio.get_cancelled_exc_class():
                    # The provider withdrew its request (Codex `serverRequest/resolved`, ACP
                    # `$/cancel_request`): the control plane must not be left waiting on it.
                    with anyio.CancelScope(shield=True):
                        await self._emit(
                            "permission.resolved",
                            {
                                "request_id": request_id,
                                "outcome": "cancelled",
                                "option_id": None,
                                "decided_by": "cancel",
                            },
                        )
                    raise
        finally:
            if supervised:
                self._pending.pop(request_id, None)
                self._on_change(len(self._pending))
        if not supervised:
            allow = _first(request.options, "allow")
            pending.decision = PermissionDecision(
                "allowed", allow.option_id if allow else None, allow.kind if allow else None
            )
            pending.decided_by = "policy"
        elif pending.decision is None:
            reject = _first(request.options, "reject")
            pending.decision = PermissionDecision(
                "timed_out", reject.option_id if reject else None, reject.kind if reject else None
            )
            pending.decided_by = "timeout"
        decision = pending.decision
        if decision.outcome != "allowed":
            self.rejected_tool_calls.add(request.tool_call_id)
        await self._emit(
            "permission.resolved",
            {
                "request_id": request_id,
                "outcome": decision.outcome,
                "option_id": decision.option_id,
                "decided_by": pending.decided_by,
            },
        )
        return decision

    def resolve(self, request_id: str, option_id: str) -> None:
        """Apply the control plane's decision. Raises PermissionCommandError for an unknown request/option."""
        pending = self._pending.get(request_id)
        if pending is None or pending.done.is_set():
            raise PermissionCommandError("permission.unknown_request", f"no pending permission request {request_id!r}")
        option = next((o for o in pending.request.options if o.option_id == option_id), None)
        if option is None:
            raise PermissionCommandError(
                "permission.unknown_option", f"option {option_id!r} is not one of request {request_id!r}'s options"
            )
        outcome: Literal["allowed", "rejected"] = "allowed" if option.kind.startswith("allow") else "rejected"
        pending.decision = PermissionDecision(outcome, option.option_id, option.kind)
        pending.decided_by = "control_plane"
        pending.done.set()

    def cancel_all(self) -> int:
        """Resolve every pending request `cancelled` (a run is being cancelled). Returns how many."""
        n = 0
        for pending in list(self._pending.values()):
            if not pending.done.is_set():
                pending.decision = PermissionDecision("cancelled", None, None)
                pending.decided_by = "cancel"
                pending.done.set()
                n += 1
        return n


def _first(options: tuple[PermissionOption, ...], prefix: str) -> PermissionOption | None:
    return next((o for o in options if o.kind.startswith(prefix)), None)
