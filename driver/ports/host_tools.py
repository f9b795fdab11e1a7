"""The host-tools port (PROTOCOL §6.3): a provider's call to a tool that runs in the control plane.

A call is announced as the lossless `host_tool.called` event and completed by the CP's
`host_tool.result` command, matched by `call_id`, so a resent result is delivered once. Every call ends
with exactly one lossless `host_tool.resolved`: `completed` (the CP answered), `timed_out` (no answer
within `host_tool_timeout_ms`; the provider gets an error result), `cancelled` (its run was cancelled or
ended) or `failed` (the CP finally rejected the `host_tool.called` event, so no answer can ever come).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from driver.interfaces import HostToolReply

Emit = Callable[[str, dict[str, Any]], Awaitable[str | None]]
Outcome = Literal["completed", "failed", "timed_out", "cancelled"]


class HostToolCommandError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Call:
    run_id: str | None
    done: anyio.Event = field(default_factory=anyio.Event)
    reply: HostToolReply | None = None
    outcome: Outcome | None = None

    def settle(self, outcome: Outcome, reply: HostToolReply) -> bool:
        """The first settlement wins; later ones are ignored (exactly one outcome per call)."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        self.reply = reply
        self.done.set()
        return True


def _error(text: str) -> HostToolReply:
    return HostToolReply([{"type": "text", "text": text}], True)


class HostToolBroker:
    def __init__(
        self,
        emit: Emit,
        *,
        id_prefix: str,
        current_run: Callable[[], str | None],
        known: set[str],
        timeout_s: float = 600.0,
    ) -> None:
        self._emit = emit
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self._calls: dict[str, _Call] = {}
        self._by_event: dict[str, str] = {}  # host_tool.called event_id → call_id
        self._current_run = current_run
        self.known = known
        self.timeout_s = timeout_s

    @property
    def pending_count(self) -> int:
        """Host tool calls waiting for the control plane's answer."""
        return len(self._calls)

    async def call(self, name: str, arguments: Any) -> HostToolReply:
        if name not in self.known:
            return _error(f"unknown host tool {name!r}")
        call_id = f"{self._prefix}-{next(self._ids)}"
        run_id = self._current_run()
        call = _Call(run_id)
        self._calls[call_id] = call
        event_id: str | None = None
        try:
            event_id = await self._emit(
                "host_tool.called", {"call_id": call_id, "run_id": run_id, "name": name, "arguments": arguments}
            )
            if event_id is not None:
                self._by_event[event_id] = call_id
            with anyio.move_on_after(self.timeout_s):
                await call.done.wait()
            call.settle("timed_out", _error(f"host tool {name!r} got no result within {self.timeout_s:g} s"))
        except BaseException:
            # The provider's side went away (its turn was cancelled): the call is over.
            call.settle("cancelled", _error(f"host tool call {call_id} was cancelled"))
            raise
        finally:
            self._calls.pop(call_id, None)
            if event_id is not None:
                self._by_event.pop(event_id, None)
            with anyio.CancelScope(shield=True):
                await self._resolved(call_id, call)
        assert call.reply is not None
        return call.reply

    async def _resolved(self, call_id: str, call: _Call) -> None:
        if call.outcome is None:
            call.settle("cancelled", _error(f"host tool call {call_id} was cancelled"))
        assert call.outcome is not None
        await self._emit("host_tool.resolved", {"call_id": call_id, "outcome": call.outcome})

    def deliver(self, call_id: str, content: list[dict[str, Any]], is_error: bool) -> None:
        call = self._calls.get(call_id)
        if call is None or call.outcome is not None:
            raise HostToolCommandError("host_tool.unknown_call", f"no pending host tool call {call_id!r}")
        call.settle("completed", HostToolReply(content, is_error))

    async def cancel_run(self, run_id: str) -> None:
        """The run is ending: its open calls resolve `cancelled` and the provider gets an error."""
        for call_id, call in list(self._calls.items()):
            if call.run_id == run_id:
                call.settle("cancelled", _error(f"host tool call {call_id} was cancelled with its run"))
        # Let the waiting calls emit their host_tool.resolved before the run's terminal is chosen.
        await anyio.lowlevel.checkpoint()

    def rejected(self, event_id: str) -> bool:
        """The CP finally rejected a `host_tool.called` event: the call can never be answered."""
        call_id = self._by_event.get(event_id)
        call = self._calls.get(call_id) if call_id is not None else None
        if call is None:
            return False
        return call.settle("failed", _error(f"the control plane refused host tool call {call_id}"))
