"""The kit's scripted driver: one WebSocket link, frames built with the driver's own structs.

A `Peer` dials, says `hello` with the epoch the script chooses, and keeps every frame it receives
(in order) and the close, so a check can wait for "a receipt for batch 3" or "a command with this id"
or "the close code" with a timeout. It never answers anything by itself: the script decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from driver import __version__
from driver.protocol.frames import (
    SUBPROTOCOL,
    Capability,
    Heartbeat,
    HeartbeatOutbox,
    Hello,
    OutboxSummary,
    encode,
)

Frame = dict[str, Any]
SESSION = "ses-conformance"


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def probe_event(instance: str, epoch: int, seq: int, message: str = "") -> Frame:
    """A valid lossless event (a `diagnostic.reported`, not run-scoped) with a PROTOCOL §4 id."""
    return {
        "event_id": f"{instance}/{epoch}/{seq:06d}",
        "seq": seq,
        "epoch": epoch,
        "kind": "diagnostic.reported",
        "delivery": "lossless",
        "session_id": SESSION,
        "run_id": None,
        "occurred_at": now(),
        "payload": {
            "code": "conformance.probe",
            "severity": "info",
            "message": message or f"probe {seq}",
            "details": {},
        },
    }


@dataclass
class Closed:
    code: int | None
    reason: str


@dataclass
class Peer:
    url: str
    token: str
    instance: str
    ssl_context: ssl.SSLContext | None = None
    frames: list[Frame] = field(default_factory=list)
    closed: Closed | None = None
    refused_http: int | None = None  # the upgrade was answered with this HTTP status instead
    ws: ClientConnection | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None

    async def open(self, epoch: int, last_command_seq: int = 0, timeout: float = 10.0) -> Frame | None:
        """Dial and say hello; the first frame the CP sends (its welcome, if it behaves), or None
        when it closed (see `closed`) or refused the upgrade (`refused_http`) first."""
        headers = {"Authorization": f"Bearer {self.token}", "Agent-Driver-Instance": self.instance}
        try:
            self.ws = await connect(
                self.url,
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                additional_headers=headers,
                ssl=self.ssl_context,
                ping_interval=None,  # the kit answers the CP's pings (websockets does) but sends none
                max_size=8 * 1024 * 1024,
                open_timeout=timeout,
                close_timeout=2,
            )
        except InvalidStatus as exc:
            self.refused_http = exc.response.status_code
            return None
        self._reader = asyncio.ensure_future(self._read())
        hello = Hello(
            protocol=1,
            driver_instance_id=self.instance,
            epoch=epoch,
            driver_version=f"{__version__}+conformance",
            pid=os.getpid(),
            runtime="acp",
            revision="rev-conformance",
            session_kind="cattle",
            capabilities=[Capability("text_stream", True)],
            last_command_seq=last_command_seq,
            outbox=OutboxSummary(lossless_pending=0),
            started_at=now(),
        )
        await self.send_raw(encode(hello).decode())
        with contextlib.suppress(TimeoutError):
            await self.wait(lambda: bool(self.frames) or self.closed is not None, timeout)
        return self.frames[0] if self.frames else None

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                try:
                    frame = json.loads(message)
                except ValueError:
                    frame = {"type": "<not JSON>", "text": str(message)[:200]}
                self.frames.append(frame if isinstance(frame, dict) else {"type": "<not an object>"})
                self._changed.set()
        except ConnectionClosed:
            pass
        self.closed = Closed(self.ws.close_code, self.ws.close_reason or "")
        self._changed.set()

    async def wait(self, condition: Callable[[], bool], timeout: float) -> None:
        """Until `condition` holds after a frame or the close; TimeoutError after `timeout` s."""
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()

    async def wait_frame(self, predicate: Callable[[Frame], bool], timeout: float) -> Frame | None:
        """The first frame received so far or within `timeout` that matches, else None."""
        found: list[Frame] = []

        def match() -> bool:
            found[:] = [f for f in self.frames if predicate(f)][:1]
            return bool(found) or self.closed is not None

        with contextlib.suppress(TimeoutError):
            await self.wait(match, timeout)
        return found[0] if found else None

    async def wait_closed(self, timeout: float) -> Closed | None:
        with contextlib.suppress(TimeoutError):
            await self.wait(lambda: self.closed is not None, timeout)
        return self.closed

    async def send_raw(self, text: str) -> bool:
        if self.ws is None:
            return False
        try:
            await self.ws.send(text)
            return True
        except ConnectionClosed:
            return False

    async def send(self, frame: Frame) -> bool:
        return await self.send_raw(json.dumps(frame))

    async def events(self, batch: int, events: list[Frame]) -> bool:
        return await self.send({"type": "events", "batch": batch, "events": events})

    async def heartbeat(self) -> bool:
        beat = Heartbeat(
            at=now(), state="ready", run_id=None, outbox=HeartbeatOutbox(lossless_pending=0, best_effort_dropped=0)
        )
        return await self.send_raw(encode(beat).decode())

    def go_silent(self) -> None:
        """Read nothing more (so no pong goes back) until `wake()`: a driver that hangs."""
        if self.ws is not None and self.ws.transport is not None:
            self.ws.transport.pause_reading()

    def wake(self) -> None:
        if self.ws is not None and self.ws.transport is not None:
            self.ws.transport.resume_reading()

    async def close(self) -> None:
        if self.ws is not None:
            with contextlib.suppress(Exception):
                await self.ws.close(1000, "conformance kit done")
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 3)
