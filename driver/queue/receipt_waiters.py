"""Callers waiting for one lossless event's receipt (a command status that must follow its fact, a
restart that mirrors a journaled terminal). Kept apart from the outbox's per-event state: only the
few events somebody watches have an entry here."""

from __future__ import annotations

import anyio


class ReceiptWaiters:
    def __init__(self) -> None:
        # Public so the outbox's removal path tests it without a call (it runs for every receipt).
        self.waiters: dict[str, anyio.Event] = {}
        self._outcomes: dict[str, str] = {}

    def watch(self, event_id: str) -> None:
        """Register interest in `event_id`'s receipt before it can possibly arrive."""
        if event_id not in self._outcomes:
            self.waiters.setdefault(event_id, anyio.Event())

    async def wait(self, event_id: str) -> str:
        """Wait until `event_id` was accepted or finally rejected; returns "accepted" or "rejected"."""
        self.watch(event_id)
        waiter = self.waiters.get(event_id)
        if waiter is not None:
            await waiter.wait()
        return self._outcomes.pop(event_id, "accepted")

    def resolve(self, event_id: str, outcome: str) -> None:
        """`event_id` left the outbox with `outcome`; wakes its waiter, if any."""
        if (waiter := self.waiters.pop(event_id, None)) is not None:
            self._outcomes[event_id] = outcome
            waiter.set()
