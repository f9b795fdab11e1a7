"""A TCP proxy between the driver and the reference control plane that misbehaves per connection.

Each accepted connection takes the next mode from `modes` (then `pass`):
- `pass`: bytes both ways, untouched.
- `hang`: accept TCP and never answer (the handshake never completes).
- `huge`: forward the handshake, then send the driver one frame header announcing 100 MiB and stream
  its payload until the driver hangs up.
- `prewelcome`: forward the handshake, then a `receipt` frame before the CP's `welcome`.
- `mute`: forward the handshake and the `welcome`, then drop everything from the CP (no pong, no
  receipt, no command): a CP that never answers pings.
- `badwelcome`: forward the handshake, rewrite the CP's `welcome` with `LinkProxy.welcome_overrides`
  (values no driver should take as they are), then bytes both ways.
Test plumbing, not a control plane: it knows WebSocket framing only enough to cut after a frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from dataclasses import dataclass, field

HUGE = 100 * 1024 * 1024


@dataclass
class Connection:
    mode: str
    huge_bytes_sent: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class LinkProxy:
    def __init__(self, upstream_port: int, modes: list[str]) -> None:
        self.upstream_port = upstream_port
        self.modes = list(modes)
        self.connections: list[Connection] = []
        self.accepted = asyncio.Condition()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0
        self.welcome_overrides: dict[str, object] = {}

    async def __aenter__(self) -> LinkProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    async def wait_connections(self, n: int, timeout: float) -> None:
        async with asyncio.timeout(timeout), self.accepted:
            await self.accepted.wait_for(lambda: len(self.connections) >= n)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = Connection(self.modes.pop(0) if self.modes else "pass")
        async with self.accepted:
            self.connections.append(conn)
            self.accepted.notify_all()
        try:
            if conn.mode == "hang":
                while await reader.read(65536):
                    pass
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            try:
                to_cp = asyncio.create_task(_pipe(reader, up_writer))
                await self._downstream(conn, up_reader, writer)
                to_cp.cancel()
            finally:
                up_writer.close()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            conn.done.set()
            writer.close()
            self._tasks.discard(task)

    async def _downstream(self, conn: Connection, up: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        if conn.mode == "pass":
            await _pipe(up, out)
            return
        head = await up.readuntil(b"\r\n\r\n")  # the HTTP 101 answer
        out.write(head)
        if conn.mode == "huge":
            out.write(b"\x81\x7f" + struct.pack("!Q", HUGE))
            chunk = b"a" * (1 << 20)
            while conn.huge_bytes_sent < HUGE:
                out.write(chunk)
                await out.drain()  # raises once the driver has hung up
                conn.huge_bytes_sent += len(chunk)
            return
        if conn.mode == "prewelcome":
            body = b'{"type":"receipt","batch":1,"accepted":[]}'
            out.write(b"\x81" + bytes([len(body)]) + body)
            await _pipe(up, out)
            return
        if conn.mode == "badwelcome":
            frame = await _read_frame(up)
            welcome = {**json.loads(_payload(frame)), **self.welcome_overrides}
            out.write(_text_frame(json.dumps(welcome).encode()))
            await _pipe(up, out)
            return
        if conn.mode == "mute":
            out.write(await _read_frame(up))  # the welcome
            await out.drain()
            while await up.read(65536):
                pass  # dropped: no pong, no frame ever reaches the driver
            return
        raise ValueError(f"unknown proxy mode {conn.mode}")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    """One unmasked (server to client) frame, as bytes."""
    head = await reader.readexactly(2)
    length = head[1] & 0x7F
    extra = b""
    if length == 126:
        extra = await reader.readexactly(2)
        length = struct.unpack("!H", extra)[0]
    elif length == 127:
        extra = await reader.readexactly(8)
        length = struct.unpack("!Q", extra)[0]
    return head + extra + await reader.readexactly(length)


def _payload(frame: bytes) -> bytes:
    """The payload of one unmasked frame read by `_read_frame`."""
    length = frame[1] & 0x7F
    start = 2 + {126: 2, 127: 8}.get(length, 0)
    return frame[start:]


def _text_frame(payload: bytes) -> bytes:
    """One unmasked, final text frame."""
    n = len(payload)
    if n < 126:
        return b"\x81" + bytes([n]) + payload
    if n < 1 << 16:
        return b"\x81\x7e" + struct.pack("!H", n) + payload
    return b"\x81\x7f" + struct.pack("!Q", n) + payload
