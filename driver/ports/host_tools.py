"""The host-tools port (PROTOCOL §6.3): a provider's call to a tool that runs in the control plane.

A call is announced as the lossless `host_tool.called` event and completed by the CP's
`host_tool.result` command, matched by `call_id`, so a resent result is delivered once.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio

from driver.adapters.base import HostToolReply

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]


class HostToolCommandError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Call:
    done: anyio.Event = field(default_factory=anyio.Event)
    reply: HostToolReply | None = None


class HostToolBroker:
    def __init__(self, emit: Emit, *, id_prefix: str, current_run: Callable[[], str | None], known: set[str]) -> None:
        self._emit = emit
        self._ids = itertools.count(1)
        self._prefix = id_prefix
        self._calls: dict[str, _Call] = {}
        self._current_run = current_run
        self.known = known

    @property
    def pending_count(self) -> int:
        """Host tool calls waiting for the control plane's answer."""
        return len(self._calls)

    async def call(self, name: str, arguments: Any) -> HostToolReply:
        if name not in self.known:
            return HostToolReply([{"type": "text", "text": f"unknown host tool {name!r}"}], True)
        call_id = f"{self._prefix}-{next(self._ids)}"
        call = _Call()
        self._calls[call_id] = call
        try:
            await self._emit(
                "host_tool.called",
                {"call_id": call_id, "run_id": self._current_run(), "name": name, "arguments": arguments},
            )
            await call.done.wait()
        finally:
            self._calls.pop(call_id, None)
        assert call.reply is not None
        return call.reply

    def deliver(self, call_id: str, content: list[dict[str, Any]], is_error: bool) -> None:
        call = self._calls.get(call_id)
        if call is None or call.done.is_set():
            raise HostToolCommandError("host_tool.unknown_call", f"no pending host tool call {call_id!r}")
        call.reply = HostToolReply(content, is_error)
        call.done.set()
