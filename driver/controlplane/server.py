"""The reference control plane: a real WebSocket server for PROTOCOL §2-§4 over a SQLite store.

Used in-process by the integration and fault tests and embedded by `agent-driver dev`, and run on its
own by `agent-driver controlplane`. One `_Link` per accepted connection; at most one per instance
(a newer one supersedes the older with 4409). Events are stored (and committed) before their receipt
is built, and every fault knob is applied in `_on_frame` / `_send_receipt` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import json
import ssl
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import structlog
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from driver.controlplane.faults import FAULT_REJECT_CODE, Faults
from driver.controlplane.live import Broker, Item, Subscription
from driver.controlplane.store import BatchResult, Store, StoredRejection, now_iso
from driver.controlplane.validation import InvalidEvent, ValidEvent, check_event
from driver.controlplane.writer import GroupWriter
from driver.protocol.frames import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    SUBPROTOCOL,
    TERMINAL_STATUSES,
    CommandUpdate,
    EventsFrame,
    FrameError,
    Heartbeat,
    Hello,
    Receipt,
    Rejection,
    Welcome,
    decode_driver_frame,
    encode,
)

if TYPE_CHECKING:
    from driver.controlplane.console.config import ConsoleConfig
    from driver.controlplane.http_api import HttpListener

log = structlog.get_logger("agent_driver.controlplane")

R = TypeVar("R")

CLOSE_PROTOCOL = 4400
CLOSE_TOO_BIG = 1009  # a frame over the fault knob max_frame_bytes (PROTOCOL §4.3)
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_HEARTBEAT = 4408
CLOSE_SUPERSEDED = 4409
CLOSE_TERMINATED = 4410
ABORT = 1006  # not a sendable close code: "close" with it means dropping the TCP connection

# A token maps to the instance ids it may drive; None means any instance.
TokenConfig = Mapping[str, Iterable[str] | None]


class _Link:
    """One accepted connection that completed the handshake for an instance."""

    def __init__(self, ws: ServerConnection, instance_id: str, hello: Hello, connection_id: str) -> None:
        self.ws = ws
        self.instance_id = instance_id
        self.epoch = hello.epoch
        self.hello = hello
        self.connection_id = connection_id
        self.ready = False  # welcome sent: commands may flow
        self.sent_commands: set[str] = set()
        self.held_receipt: bytes | None = None
        # Batches whose store write is under way, in arrival order: receipts go out in this order.
        self.receipts: asyncio.Queue[tuple[int, asyncio.Future[BatchResult]]] = asyncio.Queue()
        self.last_heard = asyncio.get_running_loop().time()
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


class ControlPlane:
    """`async with ControlPlane(db, tokens={"tok": {"drv-1"}}) as cp:` then point a driver at `cp.url`."""

    def __init__(
        self,
        db_path: str | Path,
        *,
        tokens: TokenConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        http_port: int | None = 0,
        path: str = "/driver",
        heartbeat_interval_ms: int = 5000,
        max_batch_events: int = 256,
        max_batch_bytes: int = 1_048_576,
        max_event_bytes: int = 262_144,
        hello_timeout_s: float = 10.0,
        close_timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        console: ConsoleConfig | None = None,
    ) -> None:
        self.db_path = Path(db_path)
        self.host = host
        self.port = port
        self.http_port = http_port
        self.path = path
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        self.max_event_bytes = max_event_bytes
        self.hello_timeout_s = hello_timeout_s
        # How long a close waits for the peer's close frame before dropping the TCP connection.
        self.close_timeout_s = close_timeout_s
        # With a server TLS context the link is wss:// (the HTTP API stays plain, on loopback).
        self.ssl_context = ssl_context
        # With a console config the HTTP port also serves the web console (and may leave loopback).
        self.console_config = console
        self.faults = Faults()
        self.refused_frames: list[int] = []  # sizes of frames refused with 1009 (fault knob)
        self._tokens: dict[str, frozenset[str] | None] = {
            t: (None if ids is None else frozenset(ids)) for t, ids in tokens.items()
        }
        self._links: dict[str, _Link] = {}
        self._history: list[dict[str, Any]] = []
        self._heartbeats: dict[str, dict[str, Any]] = {}
        # One broker for the object's life: subscriptions and waits carry over a restart().
        self._live = Broker()
        self._server: Server | None = None
        self._http: HttpListener | None = None
        self.stopping = False  # set while stop() runs: ends the HTTP API's long polls (events?wait_ms=)
        self._writer: GroupWriter | None = None
        self._reader: Store | None = None
        self._background: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> ControlPlane:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        self._live.close_all()

    async def start(self) -> None:
        """Open the store and listen. After a `stop()`, listens again on the same ports."""
        from driver.controlplane.http_api import start_http_api

        self.stopping = False
        self._writer = GroupWriter(self.db_path)
        await self._writer.start()
        if self._reader is None:
            self._reader = Store(self.db_path, create=False)
        self._server = await serve(
            self._handle,
            self.host,
            self.port,
            subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
            process_request=self._process_request,
            max_size=MAX_FRAME_BYTES,
            # Our own keepalive (`_keepalive`) pings and closes with 4408, as PROTOCOL §2.5 asks.
            ping_interval=None,
            ping_timeout=None,
            compression=None,
            close_timeout=self.close_timeout_s,
            ssl=self.ssl_context,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        if self.http_port is not None:
            self._http = await start_http_api(self, self.http_port)
            self.http_port = self._http.port
        log.info("controlplane.started", url=self.url, http_url=self.http_url, db=str(self.db_path))

    async def stop(self, close_code: int = 1001) -> None:
        """Close every link with `close_code` (1001 going away, 1012 restart), then stop listening."""
        self.stopping = True
        self._live.changed()
        await asyncio.gather(
            *(self._close(link.ws, close_code, "control plane stopping") for link in list(self._links.values()))
        )
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if self._http is not None:
            self._http.close()
            await self._http.wait_closed()
            self._http = None
        self._live.changed()
        if self._writer is not None:
            await self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        log.info("controlplane.stopped")

    async def restart(self, close_code: int = 1012) -> None:
        """Stop and start again on the same ports and database. Links get `close_code`: 1012 (service
        restart) by default; 1006 drops every TCP connection without a close frame, like a crash."""
        await self.stop(close_code)
        await self.start()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "ws" if self.ssl_context is None else "wss"
        return f"{scheme}://{host}:{self.port}{self.path}"

    @property
    def http_url(self) -> str | None:
        if self.http_port is None:
            return None
        host = "127.0.0.1" if self.console_config is None else self.console_config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.http_port}"

    # -- queries (for tests and the HTTP API) ---------------------------------------------------

    @property
    def store(self) -> Store:
        """A read connection on the event loop thread (sees every committed write); it stays usable
        after `stop()`, so a test can inspect the history once the control plane is gone."""
        if self._reader is None:
            self._reader = Store(self.db_path, create=False)
        return self._reader

    def events(
        self,
        instance_id: str,
        kinds: Iterable[str] | str | None = None,
        run_id: str | None = None,
        after_seq: int | None = None,
        delivery: str | None = None,
    ) -> list[dict[str, Any]]:
        if isinstance(kinds, str):
            kinds = [kinds]
        return self.store.events(instance_id, kinds=kinds, run_id=run_id, after_seq=after_seq, delivery=delivery)

    def commands(self, instance_id: str) -> list[dict[str, Any]]:
        return self.store.commands(instance_id)

    def command(self, command_id: str) -> dict[str, Any] | None:
        return self.store.command(command_id)

    def command_updates(self, command_id: str) -> list[dict[str, Any]]:
        return self.store.command_updates(command_id)

    def connected(self, instance_id: str) -> bool:
        link = self._links.get(instance_id)
        return link is not None and link.ready

    def connected_instances(self) -> list[str]:
        return sorted(i for i, link in self._links.items() if link.ready)

    def hello(self, instance_id: str) -> dict[str, Any] | None:
        """The `hello` of the instance's current link, as a dict."""
        link = self._links.get(instance_id)
        return None if link is None else msgspec.to_builtins(link.hello)  # type: ignore[no-any-return]

    def last_heartbeat(self, instance_id: str) -> dict[str, Any] | None:
        return self._heartbeats.get(instance_id)

    def token_allows(self, authorization: str | None) -> bool | frozenset[str]:
        """For an `Authorization` header value: False, True (any instance) or the allowed instance ids."""
        return token_allows(self._tokens, authorization)

    def link_history(self, instance_id: str | None = None) -> list[dict[str, Any]]:
        """Every closed connection (refused ones too): instance, epoch, connection id, close code."""
        return [h for h in self._history if instance_id is None or h["instance_id"] == instance_id]

    # -- live -----------------------------------------------------------------------------------

    def subscribe(self, instance_id: str | None = None) -> Subscription:
        """Items from now on for one instance (or all): stored events, command updates, heartbeats,
        link up/down. Close it (or use it as a context manager) when done."""
        return self._live.subscribe(instance_id)

    async def wait_for(self, instance_id: str | None, predicate: Callable[[Item], bool], timeout: float = 10.0) -> Item:
        """The first live item (see `subscribe`) matching `predicate` from now on."""
        with self.subscribe(instance_id) as sub:
            async with asyncio.timeout(timeout):
                async for item in sub:
                    if predicate(item):
                        return item
        raise RuntimeError("control plane stopped while waiting")

    async def wait_for_event(
        self,
        instance_id: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
        kinds: Iterable[str] | str | None = None,
    ) -> dict[str, Any]:
        """The first stored event (already stored or arriving later) for which `predicate` holds.

        `kinds` narrows the scan of what is already stored (worth it on long histories)."""
        wanted = {kinds} if isinstance(kinds, str) else (None if kinds is None else set(kinds))
        with self.subscribe(instance_id) as sub:
            for event in self.store.events(instance_id, kinds=wanted):
                if predicate(event):
                    return event
            async with asyncio.timeout(timeout):
                async for item in sub:
                    if item["type"] != "event" or (wanted is not None and item["kind"] not in wanted):
                        continue
                    event = {k: v for k, v in item.items() if k != "type"}
                    if predicate(event):
                        return event
        raise RuntimeError("control plane stopped while waiting")

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        """Re-check `condition` after every change in the control plane until it holds."""
        async with asyncio.timeout(timeout):
            while not condition():
                await self._live.wait_change()

    async def wait_for_command_status(
        self, command_id: str, statuses: Iterable[str] | str = TERMINAL_STATUSES, timeout: float = 10.0
    ) -> dict[str, Any]:
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)
        found: dict[str, Any] = {}

        def reached() -> bool:
            cmd = self.store.command(command_id)
            if cmd is not None and cmd["status"] in wanted:
                found.update(cmd)
                return True
            return False

        await self.wait_until(reached, timeout)
        return found

    async def wait_connected(self, instance_id: str, timeout: float = 10.0) -> None:
        await self.wait_until(lambda: self.connected(instance_id), timeout)

    async def wait_disconnected(self, instance_id: str, timeout: float = 10.0) -> None:
        await self.wait_until(lambda: instance_id not in self._links, timeout)

    # -- commands and link control ---------------------------------------------------------------

    async def send_command(
        self, instance_id: str, kind: str, *, command_id: str | None = None, **fields: Any
    ) -> tuple[str, int]:
        """Store a command (next seq of the instance) and send it now if the instance is connected;
        otherwise it goes out after the next welcome."""
        cmd = await self._write(Store.add_command, instance_id, kind, fields, command_id)
        # Watchers (the console, the dev chat) learn of commands that others queued.
        self._live.publish(instance_id, {"type": "command", "command_id": cmd["command_id"], "kind": kind})
        link = self._links.get(instance_id)
        if link is not None and link.ready:
            await self._send_command(link, cmd)
        log.info("command.queued", instance_id=instance_id, command_id=cmd["command_id"], seq=cmd["seq"], kind=kind)
        return cmd["command_id"], cmd["seq"]

    async def resend_command(self, command_id: str) -> None:
        """Send a stored command again on the current link (an idempotency probe)."""
        cmd = self.store.command(command_id)
        if cmd is None:
            raise KeyError(command_id)
        link = self._links.get(cmd["instance_id"])
        if link is None or not link.ready:
            raise RuntimeError(f"instance {cmd['instance_id']} is not connected")
        await link.ws.send(json.dumps(cmd["body"]))

    async def send_raw(self, instance_id: str, frame: dict[str, Any] | str | bytes, *, text: bool = True) -> None:
        """Send any frame as is, unstored (for tests of invalid or conflicting commands). Bytes go out
        unvalidated, as a text frame (invalid UTF-8 included) or, with `text=False`, a binary one."""
        link = self._links.get(instance_id)
        if link is None or not link.ready:
            raise RuntimeError(f"instance {instance_id} is not connected")
        data = json.dumps(frame) if isinstance(frame, dict) else frame
        await link.ws.send(data, text=text)

    async def terminate(self, instance_id: str, reason: str = "terminated") -> None:
        """Mark the instance terminated (durably: later links are refused with 4410) and close its link."""
        await self._write(Store.terminate, instance_id)
        await self.close_link(instance_id, CLOSE_TERMINATED, reason)

    async def close_link(self, instance_id: str, code: int, reason: str = "") -> bool:
        """Close the instance's link with `code` (1006 drops the TCP connection without a close frame)."""
        link = self._links.get(instance_id)
        if link is None:
            return False
        await self._close(link.ws, code, reason)
        return True

    # -- internals ------------------------------------------------------------------------------

    def _writer_or_fail(self) -> GroupWriter:
        if self._writer is None:
            raise RuntimeError("control plane is not running")
        return self._writer

    async def _write(self, fn: Callable[..., R], *args: Any) -> R:
        """Run a Store write in the store thread; returns after the COMMIT (and its fsync)."""
        if self._writer is None:
            raise RuntimeError("control plane is not running")
        return await self._writer.submit(fn, *args)

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _process_request(self, ws: ServerConnection, request: Request) -> Response | None:
        if request.path.split("?", 1)[0] != self.path:
            return ws.respond(http.HTTPStatus.NOT_FOUND, "not found\n")
        offered = [p.strip() for h in request.headers.get_all("Sec-WebSocket-Protocol") for p in h.split(",")]
        if SUBPROTOCOL not in offered:
            return ws.respond(http.HTTPStatus.BAD_REQUEST, f"subprotocol {SUBPROTOCOL} required\n")
        return None

    def _authorize(self, headers: Headers) -> tuple[int | None, str, str | None]:
        """(close code or None, reason, instance id)."""
        if self.faults.reject_auth:
            return CLOSE_UNAUTHORIZED, "token rejected", None
        allowed = token_allows(self._tokens, headers.get("Authorization"))
        if allowed is False:
            return CLOSE_UNAUTHORIZED, "bad or missing bearer token", None
        instance_id = headers.get("Agent-Driver-Instance")
        if not instance_id:
            return CLOSE_PROTOCOL, "Agent-Driver-Instance header missing", None
        if allowed is not True and instance_id not in allowed:
            return CLOSE_FORBIDDEN, "instance not allowed for this token", instance_id
        return None, "", instance_id

    async def _handle(self, ws: ServerConnection) -> None:
        connection_id = f"con-{uuid.uuid4().hex[:20]}"
        assert ws.request is not None
        code, reason, instance_id = self._authorize(ws.request.headers)
        record: dict[str, Any] = {
            "connection_id": connection_id,
            "instance_id": instance_id,
            "epoch": None,
            "opened_at": now_iso(),
        }
        link: _Link | None = None
        try:
            if code is not None:
                log.warning("link.refused", instance_id=instance_id, code=code, reason=reason)
                await self._close(ws, code, reason)
                return
            assert instance_id is not None
            link = await self._handshake(ws, instance_id, connection_id, record)
            if link is None:
                return
            keepalive = asyncio.ensure_future(self._keepalive(link))
            link.spawn(self._answer_batches(link))
            try:
                async for message in ws:
                    if not await self._on_frame(link, message):
                        break
            except ConnectionClosed:
                pass
            finally:
                keepalive.cancel()
        finally:
            if link is not None:
                for task in list(link.tasks):
                    task.cancel()
                if self._links.get(link.instance_id) is link:
                    del self._links[link.instance_id]
            await ws.wait_closed()
            close_code, close_reason = _close_of(ws)
            record.update(closed_at=now_iso(), close_code=close_code, close_reason=close_reason)
            self._history.append(record)
            if link is not None:
                self._live.publish(
                    link.instance_id,
                    {"type": "link", "state": "down", "connection_id": connection_id, "close_code": close_code},
                )
            else:
                self._live.changed()
            log.info("link.closed", instance_id=instance_id, connection_id=connection_id, code=close_code)

    async def _handshake(
        self, ws: ServerConnection, instance_id: str, connection_id: str, record: dict[str, Any]
    ) -> _Link | None:
        try:
            raw = await asyncio.wait_for(ws.recv(), timeout=self.hello_timeout_s)
        except TimeoutError:
            await self._close(ws, CLOSE_HEARTBEAT, "no hello")
            return None
        except ConnectionClosed:
            return None
        hello = self._decode(raw)
        if not isinstance(hello, Hello):
            await self._close(ws, CLOSE_PROTOCOL, "the first frame must be hello")
            return None
        record["epoch"] = hello.epoch
        if hello.protocol != PROTOCOL_VERSION:
            await self._close(ws, CLOSE_PROTOCOL, f"unsupported protocol {hello.protocol}")
            return None
        if hello.driver_instance_id != instance_id:
            await self._close(ws, CLOSE_PROTOCOL, "hello.driver_instance_id differs from the header")
            return None
        verdict = await self._write(Store.observe_epoch, instance_id, hello.epoch)
        if verdict.terminated:
            await self._close(ws, CLOSE_TERMINATED, "instance terminated")
            return None
        old = self._links.get(instance_id)
        if not verdict.allowed or (old is not None and old.epoch > hello.epoch):
            await self._close(ws, CLOSE_SUPERSEDED, f"epoch {hello.epoch} is older than {verdict.highest}")
            return None
        link = _Link(ws, instance_id, hello, connection_id)
        self._links[instance_id] = link
        if old is not None:
            # The newest link owns the instance; the older one is told so and closed. In the background:
            # a silent old peer must not hold up this welcome for the whole close timeout.
            self._spawn(self._close(old.ws, CLOSE_SUPERSEDED, "superseded by a newer connection"))
        welcome = Welcome(
            connection_id=connection_id,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            max_batch_events=self.max_batch_events,
            max_batch_bytes=self.max_batch_bytes,
            max_event_bytes=self.max_event_bytes,
            accepted_capabilities=[c.id for c in hello.capabilities if c.supported],
        )
        try:
            await ws.send(encode(welcome).decode())
        except ConnectionClosed:
            return link
        link.ready = True
        log.info("link.open", instance_id=instance_id, epoch=hello.epoch, connection_id=connection_id)
        self._live.publish(
            instance_id, {"type": "link", "state": "up", "connection_id": connection_id, "epoch": hello.epoch}
        )
        for cmd in self.store.pending_commands(instance_id, hello.last_command_seq):
            await self._send_command(link, cmd)
        return link

    @staticmethod
    def _decode(raw: str | bytes) -> Hello | Heartbeat | CommandUpdate | EventsFrame | str:
        """The frame, or a string saying why it is a protocol violation."""
        if isinstance(raw, bytes):
            return "binary frames are not allowed"
        try:
            return decode_driver_frame(raw)
        except FrameError as exc:
            return f"bad frame: {exc}"

    async def _on_frame(self, link: _Link, raw: str | bytes) -> bool:
        """Handle one frame after the handshake; False when the link is being closed."""
        link.last_heard = asyncio.get_running_loop().time()
        if self.faults.too_big(len(raw)):
            self.refused_frames.append(len(raw))
            await self._close(link.ws, CLOSE_TOO_BIG, "message too big")
            return False
        frame = self._decode(raw)
        if isinstance(frame, str):
            await self._close(link.ws, CLOSE_PROTOCOL, frame[:120])
            return False
        frame_type = type(frame).__struct_config__.tag
        assert isinstance(frame_type, str)
        fault_close = self.faults.count_frame(frame_type)
        if fault_close is not None and fault_close[0] == "before_store":
            await self._close(link.ws, fault_close[1], "fault injected")
            return False
        if isinstance(frame, Hello):
            await self._close(link.ws, CLOSE_PROTOCOL, "hello after welcome")
            return False
        if isinstance(frame, EventsFrame):
            stored = await self._submit_batch(link, frame)
            if stored is None:
                return False
            if fault_close is None:
                # Keep reading while the write is on its way to disk: pipelined batches share a commit.
                link.receipts.put_nowait((frame.batch, stored))
                return True
            # A fault close acts at this very batch: answer every earlier one first, then this one
            # (or not), so "stored but not answered" is exact.
            await link.receipts.join()
            receipt = await self._receipt_for(link, frame.batch, stored)
            if fault_close[0] == "before_receipt":
                await self._close(link.ws, fault_close[1], "fault injected")
                return False
            await self._send_receipt(link, receipt)
        elif isinstance(frame, CommandUpdate):
            await self._record_update(link, frame)
        elif isinstance(frame, Heartbeat):
            beat = msgspec.to_builtins(frame)
            beat["received_at"] = now_iso()
            self._heartbeats[link.instance_id] = beat
            self._live.publish(link.instance_id, {"type": "heartbeat", **beat})
        if fault_close is not None:
            await self._close(link.ws, fault_close[1], "fault injected")
            return False
        return True

    async def _submit_batch(self, link: _Link, frame: EventsFrame) -> asyncio.Future[BatchResult] | None:
        """Validate a batch and queue its write; None when the batch is a protocol violation."""
        if len(frame.events) > self.max_batch_events:
            # Tolerated (the limit is advice to the driver), but worth a line when debugging a driver.
            log.warning("batch.over_limit", instance_id=link.instance_id, events=len(frame.events))
        admitted, fault_rejected = self.faults.admit([bytes(raw) for raw in frame.events])
        rejections: list[StoredRejection] = []
        for raw, retryable in fault_rejected:
            checked = check_event(raw)
            if checked.event_id is None:
                await self._close(link.ws, CLOSE_PROTOCOL, "event without a readable event_id")
                return None
            rejections.append(
                StoredRejection(
                    event_id=checked.event_id,
                    code=FAULT_REJECT_CODE,
                    message="rejected by fault injection",
                    retryable=retryable,
                )
            )
        valid: list[ValidEvent] = []
        for raw in admitted:
            checked = check_event(raw)
            if isinstance(checked, InvalidEvent):
                if checked.event_id is None:
                    await self._close(link.ws, CLOSE_PROTOCOL, "event without a readable event_id")
                    return None
                log.warning(
                    "event.invalid", instance_id=link.instance_id, event_id=checked.event_id, problem=checked.message
                )
                rejections.append(
                    StoredRejection(
                        event_id=checked.event_id, code="event.invalid", message=checked.message, retryable=False
                    )
                )
            else:
                valid.append(checked)
        return self._writer_or_fail().submit(Store.insert_events, link.instance_id, valid, rejections)

    async def _receipt_for(self, link: _Link, batch: int, stored: asyncio.Future[BatchResult]) -> bytes:
        """Wait for the batch's COMMIT, announce its new events, and build its receipt."""
        result = await stored
        if self._live.has_subscribers(link.instance_id):
            self._live.publish_many(link.instance_id, result.stored_items(link.instance_id))
        else:
            self._live.changed()
        receipt = Receipt(
            batch=batch,
            accepted=result.accepted,
            rejected=[
                Rejection(event_id=r.event_id, code=r.code, message=r.message, retryable=r.retryable)
                for r in result.rejected
            ],
        )
        return encode(receipt)

    async def _answer_batches(self, link: _Link) -> None:
        """Per link: send receipts in batch arrival order, each once its events are committed."""
        while True:
            batch, stored = await link.receipts.get()
            try:
                receipt = await self._receipt_for(link, batch, stored)
                await self._send_receipt(link, receipt)
            except ConnectionClosed:
                pass  # unanswered: the driver resends, and the duplicates are accepted again
            except Exception:
                log.exception("batch.store_failed", instance_id=link.instance_id, batch=batch)
                await self._close(link.ws, 1011, "store failure")
            finally:
                link.receipts.task_done()

    async def _send_receipt(self, link: _Link, receipt: bytes) -> None:
        sends, link.held_receipt = self.faults.plan_receipt(receipt, link.held_receipt)
        if not sends:
            return
        delay_ms = sends[0][0]
        frames = [f.decode() for _, f in sends]
        if delay_ms <= 0:
            for text in frames:
                await link.ws.send(text)
            return

        async def later() -> None:
            await asyncio.sleep(delay_ms / 1000)
            try:
                for text in frames:
                    await link.ws.send(text)
            except ConnectionClosed:
                pass

        link.spawn(later())

    async def _record_update(self, link: _Link, frame: CommandUpdate) -> None:
        error = None if frame.error is None else msgspec.to_builtins(frame.error)
        changed = await self._write(
            Store.record_update, link.instance_id, frame.command_id, frame.status, frame.result, error
        )
        if not changed:
            log.info("command.update.kept", command_id=frame.command_id, status=frame.status)
        self._live.publish(
            link.instance_id,
            {
                "type": "command.update",
                "command_id": frame.command_id,
                "status": frame.status,
                "result": frame.result,
                "error": error,
                "applied": changed,
            },
        )

    async def _send_command(self, link: _Link, cmd: dict[str, Any]) -> None:
        # Replay after welcome and a live send_command may race for the same command: send it once.
        if cmd["command_id"] in link.sent_commands:
            return
        link.sent_commands.add(cmd["command_id"])
        # On a closed link the command is not terminal, so it is resent after the next welcome.
        with contextlib.suppress(ConnectionClosed):
            await link.ws.send(json.dumps(cmd["body"]))

    async def _keepalive(self, link: _Link) -> None:
        """Ping every interval; close with 4408 when nothing was heard for three intervals."""
        loop = asyncio.get_running_loop()
        interval = self.heartbeat_interval_ms / 1000

        def heard(fut: asyncio.Future[float]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                link.last_heard = loop.time()

        try:
            while True:
                await asyncio.sleep(interval)
                if loop.time() - link.last_heard > 3 * interval:
                    log.warning("link.heartbeat_timeout", instance_id=link.instance_id)
                    await self._close(link.ws, CLOSE_HEARTBEAT, "heartbeat timeout")
                    return
                waiter = asyncio.ensure_future(await link.ws.ping())
                waiter.add_done_callback(heard)
        except ConnectionClosed:
            return

    async def _close(self, ws: ServerConnection, code: int, reason: str) -> None:
        if not sendable_close_code(code):
            raise ValueError(f"close code {code} cannot be sent (use 1000-1003, 1007-1014, 3000-4999 or 1006)")
        if code == ABORT:
            if ws.transport is not None:
                ws.transport.abort()
            return
        with contextlib.suppress(ConnectionClosed):
            await ws.close(code, reason)


def sendable_close_code(code: int) -> bool:
    """Codes a close frame may carry (RFC 6455 §7.4), plus 1006 which we emulate by dropping TCP."""
    return code in (1000, 1001, 1002, 1003, ABORT) or 1007 <= code <= 1014 or 3000 <= code <= 4999


def _close_of(ws: ServerConnection) -> tuple[int, str]:
    """The close code that ended a connection: ours if we closed first (even when the peer never
    answered), else the peer's; 1006 when no close frame went either way."""
    proto = ws.protocol
    if proto.close_sent is not None and (proto.close_rcvd is None or not proto.close_rcvd_then_sent):
        return proto.close_sent.code, proto.close_sent.reason
    if proto.close_rcvd is not None:
        return proto.close_rcvd.code, proto.close_rcvd.reason
    return ABORT, ""


def token_allows(tokens: Mapping[str, frozenset[str] | None], authorization: str | None) -> bool | frozenset[str]:
    """False for a bad token; True when it allows any instance; else the set of allowed instance ids.

    Every configured token is compared in constant time, so timing does not reveal a prefix.
    """
    if not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return False
    presented_b = presented.strip().encode()
    match: bool | frozenset[str] = False
    for token, allowed in tokens.items():
        if hmac.compare_digest(token.encode(), presented_b):
            match = True if allowed is None else allowed
    return match
