"""One hardened HTTP/1.1 server core for every loopback listener the agent can reach (PROTOCOL §9).

Anyone on loopback can connect to these ports, as often as they like, and send anything, slowly or
never. So each listener (the model proxy, the host MCP server, and later ones) stands on this core,
which:

- decides on the request head: the app's `decide(head)` sees the method, the target and the headers
  (route, credential) before a single body byte is read, and answers a refusal without reading the
  body (the connection then closes, so an unread 30 MiB body costs nothing);
- bounds connections: in total and per client address (on loopback every client is 127.0.0.1, so the
  per-client cap matters only for 127.0.0.x neighbours); when a cap is reached, the oldest connection
  still sending its head is closed to make room, so keyless sockets cannot lock a keyed client out;
- bounds time: the head (from connect, or from its first byte on a kept-alive connection), the idle
  wait between requests, the body, and each write (a client that stops reading);
- bounds bytes: the head, one body, and all bodies being read at once together.

The app's handler then reads the body (`Exchange.body`, under those caps) and writes the answer
through `Exchange` (h11 frames it). h11 is imported when a server starts, not with this module, so the
driver's start-up path does not pay for it.

Interface: `LoopbackServer(decide, limits, error_body, identify)`; `bind(port)`, `start()`, `close()`;
`decide` returns a `Reply` (refuse or answer from the head alone) or a handler `async (Exchange) ->
None`. `identify` (optional) names a connection's client once, from its port: `Head.origin`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import re
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from driver import logs

if TYPE_CHECKING:
    import h11

log = logs.get("driver.listener")

READ_SIZE = 64 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int = 64
    max_per_client: int = 48
    head_timeout_s: float = 10.0  # connect (or a head's first byte) -> the whole head
    idle_timeout_s: float = 120.0  # a kept-alive connection between two requests
    body_timeout_s: float = 60.0  # the head -> the whole body
    write_timeout_s: float = 60.0  # one write towards the client (it stopped reading)
    max_head_bytes: int = 64 * 1024
    max_body_bytes: int = 32 * 1024 * 1024  # one request
    max_buffered_bytes: int = 64 * 1024 * 1024  # every body being read or held, together


@dataclass(frozen=True, slots=True)
class Head:
    """A request head, as `decide` sees it: names lower-cased, values raw."""

    method: str
    target: str
    headers: list[tuple[bytes, bytes]]
    client: str
    origin: object = None  # what `identify` said of this connection's client (None without it)

    def header(self, name: bytes) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value.decode("latin-1")
        return None


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer decided from the head alone (a refusal, a 405, a small JSON answer)."""

    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class ClientGone(Exception):
    """The client closed its connection, stopped reading, or broke the protocol mid-answer."""


class BodyRefused(Exception):
    """The body broke a cap or a deadline; the core answers `status` and closes the connection."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


Handler = Callable[["Exchange"], Awaitable[None]]
Decide = Callable[[Head], "Reply | Handler"]
# The app's error body for a refusal of the core's own (400, 408, 413, 503): (status, message, head) -> JSON.
ErrorBody = Callable[[int, str, Head | None], bytes]
# Who the client of a new connection is, from its port (the model proxy: the process holding the
# socket). Started when the connection is accepted, so it runs while the head arrives; awaited before
# the first `decide`, and its answer kept for every request of the connection.
Identify = Callable[[int], Awaitable[object]]


# A JSON string (escapes included): what `json_values` leaves out of its count.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def json_values(raw: bytes, enough: int) -> int:
    """An upper bound on how many values (objects, arrays, elements, members) `raw` decodes into,
    exact enough to compare with `enough`: its commas and openings, outside strings once the quick
    count (strings included) exceeds `enough`. A body is the agent's: 16 MiB of `{}`s decoded whole is
    ~400 MiB of Python objects, so a listener that decodes a body whole bounds this first."""

    def count(data: bytes) -> int:
        return data.count(b",") + data.count(b"{") + data.count(b"[")

    quick = count(raw)
    return quick if quick <= enough else count(_JSON_STRING.sub(b"", raw))


def _plain_error(status: int, message: str, head: Head | None) -> bytes:
    return json.dumps({"error": message}).encode()


class _Pool:
    """Bytes of request bodies held at once, over every connection."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used = max(0, self.used - n)


class Exchange:
    """One request on one connection: its body (read on demand, bounded) and its answer."""

    def __init__(
        self,
        server: LoopbackServer,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: Head,
    ) -> None:
        self._server = server
        self._conn = conn
        self._reader = reader
        self._writer = writer
        self.head = head
        self._held = 0  # bytes of the pool this request holds
        self.body_read = False

    async def body(self) -> bytes:
        """The whole body, within the body cap, the shared pool and the body deadline."""
        import h11

        limits = self._server.limits
        declared = self.head.header(b"content-length")
        if declared is not None and declared.strip().isdigit():
            size = int(declared)
            if size > limits.max_body_bytes:
                raise BodyRefused(413, f"request body over {limits.max_body_bytes} bytes")
            self._take(size)
        out = bytearray()
        try:
            async with asyncio.timeout(limits.body_timeout_s):
                while True:
                    event = self._conn.next_event()
                    if event is h11.NEED_DATA:
                        if self._conn.they_are_waiting_for_100_continue:
                            await self._write(self._conn.send(h11.InformationalResponse(status_code=100, headers=[])))
                        data = await self._reader.read(READ_SIZE)
                        if not data:
                            raise ClientGone
                        self._conn.receive_data(data)
                    elif isinstance(event, h11.Data):
                        if declared is None:  # chunked: take from the pool as it comes
                            if len(out) + len(event.data) > limits.max_body_bytes:
                                raise BodyRefused(413, f"request body over {limits.max_body_bytes} bytes")
                            self._take(len(event.data))
                        out += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        self.body_read = True
                        return bytes(out)
                    elif isinstance(event, h11.ConnectionClosed):
                        raise ClientGone
        except TimeoutError:
            raise BodyRefused(408, f"request body not received within {limits.body_timeout_s:g} s") from None
        except h11.RemoteProtocolError as exc:
            raise BodyRefused(400, f"malformed request body: {exc}") from None

    def _take(self, n: int) -> None:
        if not self._server.pool.take(n):
            raise BodyRefused(503, "the listener is holding too many request bytes; retry shortly")
        self._held += n

    def release(self) -> None:
        self._server.pool.give(self._held)
        self._held = 0

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes = b"") -> None:
        import h11

        await self._write(self._conn.send(h11.Response(status_code=status, headers=headers, reason=reason)))

    async def send(self, data: bytes) -> None:
        import h11

        if data:
            await self._write(self._conn.send(h11.Data(data=data)))

    async def end(self) -> None:
        import h11

        await self._write(self._conn.send(h11.EndOfMessage()))

    async def reply(self, reply: Reply) -> None:
        headers = [(b"content-length", str(len(reply.body)).encode()), *reply.headers]
        await self.respond(reply.status, headers)
        await self.send(reply.body)
        await self.end()

    @property
    def answered(self) -> bool:
        import h11

        return self._conn.our_state is not h11.SEND_RESPONSE

    async def _write(self, data: bytes | None) -> None:
        if not data:
            return
        try:
            self._writer.write(data)
            async with asyncio.timeout(self._server.limits.write_timeout_s):
                await self._writer.drain()
        except (ConnectionError, RuntimeError, TimeoutError) as exc:
            raise ClientGone from exc


@dataclass(slots=True)
class _Conn:
    task: asyncio.Task[Any]
    client: str
    deciding: bool = True  # still sending (or about to send) a request head


class LoopbackServer:
    def __init__(
        self,
        decide: Decide,
        *,
        name: str,
        limits: Limits | None = None,
        error_body: ErrorBody | None = None,
        identify: Identify | None = None,
    ) -> None:
        self.decide = decide
        self.identify = identify
        self.name = name
        self.limits = limits or Limits()
        self._error_body = error_body or _plain_error
        self.pool = _Pool(self.limits.max_buffered_bytes)
        self._sock: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._conns: dict[int, _Conn] = {}  # insertion order: oldest first
        self._ids = itertools.count()
        self.refused_connections = 0

    def bind(self, port: int = 0) -> int:
        """Bind 127.0.0.1:`port` now (0: ephemeral) and return the port; serving starts with `start()`.

        proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that say they are TCP, and
        without it each small event after the first waits for the client's delayed ACK (~40 ms)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        return self.port

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1]) if self._sock is not None else 0

    @property
    def connections(self) -> int:
        return len(self._conns)

    async def start(self) -> None:
        import h11  # noqa: F401  (imported here, off the driver's start-up path)

        if self._server is not None:
            return
        if self._sock is None:
            self.bind(0)
        self._server = await asyncio.start_server(self._accept, sock=self._sock)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        elif self._sock is not None:
            self._sock.close()
        tasks = [c.task for c in self._conns.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    # -- admission ------------------------------------------------------------------------------------
    def _admit(self, client: str) -> bool:
        """Room for one more connection from `client`, closing the oldest undecided one if need be."""
        limits = self.limits
        for _ in range(2):
            total = len(self._conns)
            mine = sum(1 for c in self._conns.values() if c.client == client)
            if total < limits.max_connections and mine < limits.max_per_client:
                return True
            over_client = mine >= limits.max_per_client
            victim = next(
                (c for c in self._conns.values() if c.deciding and (not over_client or c.client == client)), None
            )
            if victim is None:
                return False
            victim.deciding = False  # counted out now; its task ends at its next await
            victim.task.cancel()
            self._conns = {k: v for k, v in self._conns.items() if v is not victim}
        return False

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if task is None or not self._admit(client):
            self.refused_connections += 1
            if self.refused_connections <= 10 or self.refused_connections % 100 == 0:
                log.warning("listener.connection_refused", listener=self.name, count=self.refused_connections)
            writer.close()
            return
        conn_id = next(self._ids)
        entry = _Conn(task, client)
        self._conns[conn_id] = entry
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        origin: asyncio.Task[object] | None = None
        if self.identify is not None and isinstance(peer, tuple) and len(peer) >= 2:
            origin = asyncio.ensure_future(self.identify(int(peer[1])))
        try:
            await self._serve(entry, reader, writer, origin)
        except (ClientGone, ConnectionError, asyncio.CancelledError):
            pass  # a cancel is close() or an eviction: this task is the server's, nobody awaits it
        except Exception as exc:  # no input may take the driver down: log and drop the connection
            log.warning("listener.connection_failed", listener=self.name, error=f"{type(exc).__name__}: {exc}")
        finally:
            if origin is not None and not origin.done():
                origin.cancel()
            self._conns.pop(conn_id, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    # -- one connection -------------------------------------------------------------------------------
    async def _serve(
        self,
        entry: _Conn,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        origin: asyncio.Task[object] | None,
    ) -> None:
        import h11

        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        first = True
        who: object = None
        while True:
            entry.deciding = True
            head = await self._read_head(conn, reader, writer, first)
            if head is None:
                return
            if first and origin is not None:
                who = await self._origin(origin)
            if who is not None:
                head = dataclasses.replace(head, origin=who)
            first = False
            entry.deciding = False
            exchange = Exchange(self, conn, reader, writer, head)
            try:
                decision = self.decide(head)
                if isinstance(decision, Reply):
                    await exchange.reply(decision)
                else:
                    await decision(exchange)
            except BodyRefused as exc:
                if not exchange.answered:
                    await exchange.reply(self._error(exc.status, exc.message, head))
                return
            finally:
                exchange.release()
            # A refusal leaves the body unread: the connection closes rather than read it.
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _read_head(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bool
    ) -> Head | None:
        """The next request head, or None when the connection is over (closed, timed out, malformed)."""
        import h11

        limits = self.limits
        started = False  # a byte of this head has arrived
        # A fresh connection has head_timeout_s for its whole head; a kept-alive one idles up to
        # idle_timeout_s for a first byte, then has head_timeout_s for the rest.
        deadline = asyncio.get_running_loop().time() + (limits.head_timeout_s if first else limits.idle_timeout_s)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._raw_error(conn, writer, 400, f"malformed request: {exc}")
                return None
            if isinstance(event, h11.Request):
                peer = writer.get_extra_info("peername")
                return Head(
                    method=event.method.decode("ascii", "replace"),
                    target=event.target.decode("latin-1"),
                    headers=list(event.headers),
                    client=str(peer[0]) if isinstance(peer, tuple) and peer else "?",
                )
            if event is not h11.NEED_DATA:
                return None  # ConnectionClosed, or nothing more to read
            try:
                async with asyncio.timeout_at(deadline):
                    data = await reader.read(READ_SIZE)
            except TimeoutError:
                if started:
                    await self._raw_error(conn, writer, 408, "request head not received in time")
                return None
            if not data:
                return None
            if not started:
                started = True
                if not first:
                    deadline = asyncio.get_running_loop().time() + limits.head_timeout_s
            conn.receive_data(data)

    async def _origin(self, task: asyncio.Task[object]) -> object:
        """The identification started at accept; None when it failed (the app keeps its default)."""
        try:
            return await task
        except Exception as exc:
            log.debug("listener.identify_failed", listener=self.name, error=f"{type(exc).__name__}: {exc}")
            return None

    def _error(self, status: int, message: str, head: Head | None) -> Reply:
        return Reply(status, self._error_body(status, message, head), [(b"content-type", b"application/json")])

    async def _raw_error(self, conn: h11.Connection, writer: asyncio.StreamWriter, status: int, message: str) -> None:
        """An error before a whole head was read; the connection closes after it."""
        import h11

        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        reply = self._error(status, message, None)
        headers = [(b"content-length", str(len(reply.body)).encode()), (b"connection", b"close"), *reply.headers]
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError, RuntimeError, TimeoutError):
            writer.write(conn.send(h11.Response(status_code=status, headers=headers)) or b"")
            writer.write(conn.send(h11.Data(data=reply.body)) or b"")
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            async with asyncio.timeout(1.0):
                await writer.drain()
