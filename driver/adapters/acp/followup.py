"""Steering an ACP run (PROTOCOL §3.1, mode `follow_up`).

ACP v1 has no way into a running `session/prompt`, and a second prompt on the session must wait for
the first to end. So a steer is held here until the run's current prompt ends; the run then sends
one more `session/prompt` carrying every steer held by then (in arrival order), and its terminal
comes after that turn. A steer is delivered when that prompt is written to the agent. A cancel, or
a run that ends without another turn, refuses what is still held.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anyio

from driver.adapters.common.base import SteerRefused


@dataclass
class FollowUp:
    blocks: list[dict[str, Any]]
    done: anyio.Event = field(default_factory=anyio.Event)
    refused: SteerRefused | None = None

    def delivered(self) -> None:
        self.done.set()

    def refuse(self, error: SteerRefused) -> None:
        if not self.done.is_set():
            self.refused = error
            self.done.set()

    async def wait(self) -> None:
        await self.done.wait()
        if self.refused is not None:
            raise self.refused


class FollowUps:
    """The steers held for one run."""

    def __init__(self) -> None:
        self.held: list[FollowUp] = []
        self.closed: SteerRefused | None = None  # set once the run takes no more

    def add(self, blocks: list[dict[str, Any]]) -> FollowUp:
        f = FollowUp(blocks)
        if self.closed is not None:
            f.refuse(self.closed)
        else:
            self.held.append(f)
        return f

    def take(self) -> list[FollowUp]:
        """Everything held now, for the next prompt."""
        batch, self.held = self.held, []
        return batch

    def close(self, error: SteerRefused) -> None:
        """No more turns for this run: refuse what is held and whatever comes later."""
        if self.closed is None:
            self.closed = error
        for f in self.take():
            f.refuse(error)


def blocks_of(batch: list[FollowUp]) -> list[dict[str, Any]]:
    return [b for f in batch for b in f.blocks]


def deliver_all(batch: list[FollowUp]) -> None:
    for f in batch:
        f.delivered()
