"""The runs the chat follows (no I/O): the one it shows now, and those queued in the driver behind it,
in start order (PROTOCOL §3.1). The pump tells it about terminals and refusals as they are stored; the
chat's loop moves on to the next run when the one it shows ends."""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import Literal

from agent_lab.dev.common import new_command_id


@dataclass
class Followed:
    run_id: str
    command_id: str
    cancel_sent: bool = False
    terminal_seen: bool = False


def new_run() -> Followed:
    """A new run id each time; the run is known before its command goes out, so no event of it can
    arrive unrecognised."""
    return Followed(f"run-{uuid.uuid4().hex[:12]}", new_command_id())


class Following:
    def __init__(self) -> None:
        self.run: Followed | None = None
        self.queued: deque[Followed] = deque()
        self._queued_ended: dict[str, str] = {}  # a queued run's terminal seen before the chat followed it

    def terminal(self, run_id: object, kind: str) -> bool:
        """A run's terminal event: True when it ends the run shown now. A queued run may end before the
        loop follows it: its terminal is kept for then."""
        run = self.run
        if run is not None and run_id == run.run_id:
            run.terminal_seen = True
            return True
        if any(q.run_id == run_id for q in self.queued):
            self._queued_ended[str(run_id)] = kind
        return False

    def refused(self, command_id: object) -> Literal["queued", "run"] | None:
        """A failed `input.start`: a queued run refused before it started (dropped), the run shown now
        (ended by it, unless its own terminal already told the story), or neither."""
        queued = next((q for q in self.queued if q.command_id == command_id), None)
        if queued is not None:
            self.queued.remove(queued)
            return "queued"
        run = self.run
        if run is None or run.command_id != command_id or run.terminal_seen:
            return None
        run.terminal_seen = True
        return "run"

    def follow_next(self) -> str | None:
        """The driver starts the next queued run now: show it. Its terminal, when it came already."""
        self.run = self.queued.popleft()
        ended = self._queued_ended.pop(self.run.run_id, None)
        if ended is not None:
            self.run.terminal_seen = True
        return ended
