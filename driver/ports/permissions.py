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
from typing import Any, Literal, cast

import anyio

from driver import logs
from driver.interfaces import PermissionDecision, PermissionOption, PermissionOptionKind, PermissionRequest
from driver.queue.asked import Asked

log = logs.get(__name__)

Emit = Callable[[str, dict[str, Any]], Awaitable[object]]
DecidedBy = Literal["control_plane", "policy", "timeout", "cancel"]

# Requests open at once (supervised), for every runtime. A real provider asks one per tool call it is
# about to run, a handful in parallel; a provider the agent subverted could keep thousands open, each a
# task here and a pending request at the control plane. Past this, a request is refused at once and
# never reaches the CP. The Claude client refuses its CLI's prompts at the same bound.
MAX_OPEN_REQUESTS = 32
# Refusals past the bound each make a log line; only the first few become `diagnostic.reported`, then
# one saying the rest are only counted, so a flooding provider cannot flood the outbox instead.
OVERFLOW_DIAGNOSTICS = 5


def resolved_payload(request_id: str, outcome: str, option_id: str | None, decided_by: DecidedBy) -> dict[str, Any]:
    """The `permission.resolved` payload: the broker's, and restart recovery's for a dead run."""
    return {"request_id": request_id, "outcome": outcome, "option_id": option_id, "decided_by": decided_by}


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
    # Set once `permission.resolved` is admitted: the CP's permission.resolve finishes after it, so its
    # command status can never be durable without the decision it caused (PROTOCOL §4.1, §8.2).
    announced: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class _Carried:
    """A request a dead predecessor announced (PROTOCOL §8.2), not yet met again in the re-read output."""

    asked: Asked
    decided: PermissionDecision | None = None
    announced: anyio.Event = field(default_factory=anyio.Event)


class PermissionBroker:
    def __init__(
        self,
        emit: Emit,
        *,
        policy: Literal["full_access", "supervised"],
        timeout_ms: int,
        id_prefix: str,
        on_pending_change: Callable[[int], None] = lambda n: None,
        durable: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit = emit
        self.policy = policy
        self.timeout_s = timeout_ms / 1000.0
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self._pending: dict[str, _Pending] = {}
        self._on_change = on_pending_change
        self._durable = durable
        self.rejected_tool_calls: set[str] = set()
        self._carried: dict[str, _Carried] = {}  # request_id → a predecessor's request (reattach)
        self.refused_over_cap = 0  # requests refused because MAX_OPEN_REQUESTS were open

    def carry(self, records: list[Asked]) -> None:
        """A reattach (PROTOCOL §8.2): the requests the run's dead predecessor announced, as journaled.
        When the re-read output meets one again (same tool call), it keeps its `request_id` and
        `expires_at` instead of being announced anew; one already decided is answered as decided.
        `release_carried` when the continued run ends resolves what was never met."""
        self._carried = {r.request_id: _Carried(r) for r in records}

    def _take_carried(self, tool_call_id: str) -> _Carried | None:
        for request_id, carried in self._carried.items():
            if carried.asked.tool_call_id == tool_call_id:
                del self._carried[request_id]
                return carried
        return None

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    async def request(self, request: PermissionRequest) -> PermissionDecision:
        carried = self._take_carried(request.tool_call_id) if self._carried else None
        if carried is not None and carried.asked.outcome is not None:
            # Decided and journaled before the predecessor died, never answered to the provider: both
            # events are the CP's already, so nothing is emitted.
            decision = _journaled_decision(carried.asked, request.options)
            if decision.outcome != "allowed":
                self.rejected_tool_calls.add(request.tool_call_id)
            return decision
        supervised = self.policy != "full_access"
        if supervised and carried is None and len(self._pending) >= MAX_OPEN_REQUESTS:
            # Checked and acted on before any await: a burst of requests cannot all pass the check.
            return await self._refuse_over_cap(request)
        pending = _Pending(request)
        if carried is not None:
            # The CP has this request_id already: it keeps it and its expires_at, and is not told twice.
            request_id = carried.asked.request_id
            left = (_parse_time(carried.asked.expires_at) or datetime.now(UTC)) - datetime.now(UTC)
            deadline = anyio.current_time() + max(0.0, left.total_seconds())
            pending.announced = carried.announced
            if carried.decided is not None:  # the CP answered before the output got here again
                pending.decision = carried.decided
                pending.done.set()
        else:
            request_id = f"{self._prefix}-{next(self._ids)}"
            # The deadline is fixed together with `expires_at`, before `emit` (which may wait on the
            # outbox's backpressure): the timeout fires at `expires_at`, however long the emit took.
            deadline = anyio.current_time() + self.timeout_s
            expires = datetime.now(UTC) + timedelta(seconds=self.timeout_s)
        if supervised:
            # Pending from the start: the event may reach the CP, and its answer come back, while
            # `emit` still waits.
            self._pending[request_id] = pending
            self._on_change(len(self._pending))
        try:
            if carried is None:
                await self._emit(
                    "permission.requested",
                    {
                        "request_id": request_id,
                        "tool_call_id": request.tool_call_id,
                        "title": request.title,
                        "options": [
                            {"option_id": o.option_id, "kind": o.kind, "label": o.label} for o in request.options
                        ],
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
                        await self._announce(request_id, pending, "cancelled", None, "cancel")
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
        await self._announce(request_id, pending, decision.outcome, decision.option_id, pending.decided_by)
        if self._durable is not None:
            # The decision is journaled before the provider hears it: a successor that finds the answer
            # in the keeper's input log finds the decision too (PROTOCOL §8.2), never a request it
            # would have to call cancelled. One group commit, against a human's answer.
            await self._durable()
        return decision

    async def _refuse_over_cap(self, request: PermissionRequest) -> PermissionDecision:
        """A request past `MAX_OPEN_REQUESTS`: rejected at once (a reject option when it has one), with
        neither `permission.requested` nor `permission.resolved` (the CP never had it to decide)."""
        self.refused_over_cap += 1
        reason = (
            f"too many permission requests open (limit {MAX_OPEN_REQUESTS}); "
            f"request for tool call {request.tool_call_id!r} refused without asking the control plane"
        )
        log.warning("permission.refused_over_cap", tool_call_id=request.tool_call_id, refused=self.refused_over_cap)
        self.rejected_tool_calls.add(request.tool_call_id)
        if self.refused_over_cap <= OVERFLOW_DIAGNOSTICS + 1:
            if self.refused_over_cap > OVERFLOW_DIAGNOSTICS:
                reason = "the provider keeps asking past the open permission limit: further refusals are only logged"
            details = {
                "limit": MAX_OPEN_REQUESTS,
                "refused": self.refused_over_cap,
                "tool_call_id": request.tool_call_id,
            }
            await self._emit(
                "diagnostic.reported",
                {"code": "permission.too_many_open", "severity": "warning", "message": reason, "details": details},
            )
        reject = _first(request.options, "reject")
        return PermissionDecision("rejected", reject.option_id if reject else None, reject.kind if reject else None)

    async def _announce(
        self, request_id: str, pending: _Pending, outcome: str, option_id: str | None, decided_by: DecidedBy
    ) -> None:
        try:
            await self._emit("permission.resolved", resolved_payload(request_id, outcome, option_id, decided_by))
        finally:
            pending.announced.set()

    def resolve(self, request_id: str, option_id: str) -> anyio.Event:
        """Apply the control plane's decision. Raises PermissionCommandError for an unknown request/option.
        Returns the event set once the decision's `permission.resolved` is admitted (the caller finishes
        the command after it). A request carried over a reattach and not met again yet takes the
        decision now; it is announced when the re-read output reaches the request."""
        pending = self._pending.get(request_id)
        carried = self._carried.get(request_id) if pending is None else None
        if carried is not None and carried.decided is None:
            kinds = dict(carried.asked.options)
            if option_id not in kinds:
                raise PermissionCommandError(
                    "permission.unknown_option", f"option {option_id!r} is not one of request {request_id!r}'s options"
                )
            carried.decided = _decision(option_id, kinds[option_id])
            return carried.announced
        if pending is None or pending.done.is_set():
            raise PermissionCommandError("permission.unknown_request", f"no pending permission request {request_id!r}")
        option = next((o for o in pending.request.options if o.option_id == option_id), None)
        if option is None:
            raise PermissionCommandError(
                "permission.unknown_option", f"option {option_id!r} is not one of request {request_id!r}'s options"
            )
        pending.decision = _decision(option.option_id, option.kind)
        pending.decided_by = "control_plane"
        pending.done.set()
        return pending.announced

    def cancel_all(self) -> int:
        """Resolve every pending request `cancelled` (a run is being cancelled). Returns how many."""
        n = 0
        for pending in list(self._pending.values()):
            if not pending.done.is_set():
                pending.decision = PermissionDecision("cancelled", None, None)
                pending.decided_by = "cancel"
                pending.done.set()
                n += 1
        for carried in self._carried.values():
            if carried.decided is None:
                carried.decided = PermissionDecision("cancelled", None, None)
                n += 1
        return n

    async def release_carried(self) -> None:
        """The continued run ends (PROTOCOL §8.2): a predecessor's request the re-read output never met
        again (the provider withdrew it, or the run ended first) is resolved `cancelled`, so the CP is
        never left waiting on it. Called before the run's terminal, which no run event may follow."""
        carried, self._carried = self._carried, {}
        for c in carried.values():
            if c.asked.outcome is not None:
                continue  # resolved already, as the CP knows
            # Even one the CP decided: the provider never had the decision applied.
            pending = _Pending(PermissionRequest(c.asked.tool_call_id, "", ()), announced=c.announced)
            await self._announce(c.asked.request_id, pending, "cancelled", None, "cancel")


def _first(options: tuple[PermissionOption, ...], prefix: str) -> PermissionOption | None:
    return next((o for o in options if o.kind.startswith(prefix)), None)


def _decision(option_id: str, kind: str) -> PermissionDecision:
    outcome: Literal["allowed", "rejected"] = "allowed" if kind.startswith("allow") else "rejected"
    return PermissionDecision(outcome, option_id, cast(PermissionOptionKind, kind))


def _journaled_decision(record: Asked, options: tuple[PermissionOption, ...]) -> PermissionDecision:
    """A predecessor's journaled decision, in the re-met request's terms."""
    outcome = record.outcome if record.outcome in ("allowed", "rejected", "cancelled", "timed_out") else "cancelled"
    option = next((o for o in options if o.option_id == record.option_id), None)
    if option is None and outcome != "allowed":
        option = _first(options, "reject")
    return PermissionDecision(
        cast(Literal["allowed", "rejected", "cancelled", "timed_out"], outcome),
        option.option_id if option else record.option_id,
        option.kind if option else None,
    )


def _parse_time(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
