"""The permission requests the chat asks the user about, one at a time, oldest first (no I/O): the
chat says and sends; this decides which request is asked, with which option it is answered, and
what a resolution from elsewhere (a timeout, a cancel, the web console) changes."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_lab.dev.view import choose_option


@dataclass(frozen=True, slots=True)
class Settled:
    from_console: bool  # still asked here, so the answer came from elsewhere: the web console
    ask_next: bool  # the request being asked went: ask the next one


class Asking:
    def __init__(self) -> None:
        self._pending: deque[Mapping[str, Any]] = deque()

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(self, request: Mapping[str, Any]) -> bool:
        """Queue a request; True when it is the one to ask now."""
        self._pending.append(request)
        return len(self._pending) == 1

    def head(self) -> Mapping[str, Any]:
        return self._pending[0]

    def clear(self) -> None:
        self._pending.clear()

    def take(self, allow: bool) -> tuple[Mapping[str, Any], str | None]:
        """The request being asked, answered: it and its option id (None: none of that kind offered)."""
        request = self._pending.popleft()
        return request, choose_option(request.get("options") or [], allow)

    def settle(self, resolved: Mapping[str, Any]) -> Settled:
        """A `permission.resolved` the chat did not answer itself: stop asking about it."""
        request_id = resolved.get("request_id")
        head = self._pending[0].get("request_id") if self._pending else None
        asked = any(p.get("request_id") == request_id for p in self._pending)
        self._pending = deque(p for p in self._pending if p.get("request_id") != request_id)
        return Settled(
            from_console=resolved.get("decided_by") == "control_plane" and asked,
            ask_next=head == request_id and bool(self._pending),
        )
