"""The console's live view of one instance: a Server-Sent Events stream of what the store committed.

A live item from the control plane is only a wake-up: the stream then reads the store for events past
its cursor (the events table's row id, sent as the SSE `id`), so the page shows exactly what was stored,
in store order, and a reconnecting browser (`Last-Event-ID`) resumes without gaps or repeats.

SSE event names: `instance` (a summary, on link and heartbeat changes), `commands` (every command of
the instance, once per connection), `command` (one command row after it was queued or updated),
`stored` (one stored event).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from agent_lab.controlplane.console.httpio import head_bytes

if TYPE_CHECKING:
    from agent_lab.controlplane.console.queries import ConsoleQueries
    from agent_lab.controlplane.console.views import InstanceViews
    from agent_lab.controlplane.server import ControlPlane

KEEPALIVE_S = 15.0
BATCH = 500
RETRY_MS = 1000


def sse(name: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class InstanceStream:
    def __init__(
        self,
        cp: ControlPlane,
        queries: ConsoleQueries,
        views: InstanceViews,
        instance_id: str,
        cursor: int,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.cp = cp
        self.queries = queries
        self.views = views
        self.instance_id = instance_id
        self.cursor = cursor
        self.writer = writer
        self.sub = cp.subscribe(instance_id)  # before the backlog is read: nothing falls in between
        self.closed = False

    def close(self) -> None:
        """End the stream; it reads the store no more (so the store connection may close right after)."""
        self.closed = True
        self.sub.close()

    async def run(self) -> None:
        try:
            self.writer.write(head_bytes(200, "text/event-stream", None) + f"retry: {RETRY_MS}\n\n".encode())
            await self._send(sse("instance", self.views.summary(self.instance_id)))
            await self._send(sse("commands", self.cp.commands(self.instance_id)))
            await self._flush_events()
            while True:
                try:
                    item = await self.sub.get(timeout=KEEPALIVE_S)
                except TimeoutError:
                    await self._send(b": keepalive\n\n")
                    continue
                await self._on_item(item)
        except StopAsyncIteration:
            return  # the control plane is stopping
        finally:
            self.sub.close()

    async def _on_item(self, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if self.closed:
            return
        if kind == "event":
            await self._flush_events()
        elif kind in ("command", "command.update"):
            row = self.cp.command(str(item.get("command_id")))
            if row is not None:
                await self._send(sse("command", row))
        elif kind in ("heartbeat", "link"):
            await self._send(sse("instance", self.views.summary(self.instance_id)))

    async def _flush_events(self) -> None:
        while not self.closed:
            events = self.queries.events_after(self.instance_id, self.cursor, BATCH)
            if not events:
                return
            self.writer.write(b"".join(sse("stored", e, e["row"]) for e in events))
            self.cursor = events[-1]["row"]
            await self.writer.drain()

    async def _send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()
