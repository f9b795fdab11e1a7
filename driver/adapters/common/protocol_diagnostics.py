"""Bounded `provider.protocol` diagnostics for a provider that breaks its wire protocol.

A provider that writes garbage may do it on every line: each violation is logged (`jsonrpc.*`) and
counted, but only the first `limit` become `diagnostic.reported` events, then one saying the rest are
only counted, so a broken provider cannot flood the outbox with diagnostics.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
DEFAULT_LIMIT = 5


class ProtocolDiagnostics:
    def __init__(self, emit: Emit, provider: str, limit: int = DEFAULT_LIMIT) -> None:
        self._emit = emit
        self._provider = provider
        self.limit = limit
        self.count = 0

    async def __call__(self, what: str) -> None:
        self.count += 1
        if self.count <= self.limit:
            message = f"{self._provider} sent {what}; ignored"
        elif self.count == self.limit + 1:
            message = f"{self._provider} keeps breaking the protocol: further violations are only counted in the logs"
        else:
            return
        await self._emit(
            "diagnostic.reported",
            {"code": "provider.protocol", "severity": "warning", "message": message, "details": {"count": self.count}},
        )
